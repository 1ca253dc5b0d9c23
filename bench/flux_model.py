"""The synthetic Flux-shaped diffusion model the GPU benchmarks and lifecycle checks use: built
through ComfyUI's own model classes (so ComfyUI's model management treats it as a real Flux),
bf16, with cheap deterministic weights. Import after ComfyUI's args are parsed."""


def build(depth: int, tiny: bool):
    """A Flux model of `depth` double blocks (2x single blocks); `tiny`: narrow, for CPU runs."""
    import torch

    import comfy.supported_models

    cfg = dict(image_model="flux", in_channels=16, patch_size=2, out_channels=16, vec_in_dim=768, context_in_dim=4096,
               hidden_size=3072, mlp_ratio=4.0, num_heads=24, depth=depth, depth_single_blocks=2 * depth,
               axes_dim=[16, 56, 56], theta=10000, qkv_bias=True, guidance_embed=True)
    if tiny:
        cfg.update(hidden_size=256, num_heads=2, context_in_dim=64, vec_in_dim=32)
    config = comfy.supported_models.Flux(cfg)
    config.set_inference_dtype(torch.bfloat16, None)
    model = config.get_model({}, "")
    # Cheap deterministic values (a random fill of 24 GB takes a minute), different per tensor.
    with torch.no_grad():
        for index, p in enumerate(model.parameters()):
            p.fill_(0.002 * ((index % 7) - 3))
    return model, cfg

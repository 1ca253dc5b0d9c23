"""What the in-process ComfyUI benchmarks share: starting ComfyUI's modules in this process, the
synthetic Flux-shaped diffusion model (built through ComfyUI's own model classes, so its model
management treats it as a real Flux; bf16, seeded random weights that differ per tensor), the
inputs of one step, and the check that no CUDA error was left behind."""

import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))


def arg(name, default, kind=None):
    """The value after `name` on the command line (as `kind`, by default the default's type)."""
    return (kind or type(default))(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def start_comfy(comfy_dir, cpu: bool):
    """Makes ComfyUI (in `comfy_dir`) and this repository importable and lets ComfyUI parse
    its own arguments (only --cpu, or none). Call after reading this script's arguments."""
    sys.path[:0] = [comfy_dir, os.path.dirname(TESTS), TESTS]
    sys.argv = [sys.argv[0]] + (["--cpu"] if cpu else [])
    import comfy.options

    comfy.options.enable_args_parsing()


def step_inputs(cfg, device, tokens: int, context: int):
    """Seeded inputs of one diffusion-model step: latent (tokens x tokens), text context,
    pooled vector, timestep and guidance. Pass as model(x, t, ctx, y=y, guidance=guidance)."""
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, tokens, tokens, generator=g).to(device, torch.bfloat16)
    ctx = torch.randn(1, context, cfg["context_in_dim"], generator=g).to(device, torch.bfloat16)
    y = torch.randn(1, cfg["vec_in_dim"], generator=g).to(device, torch.bfloat16)
    return x, torch.tensor([0.5], device=device), ctx, y, torch.tensor([3.5], device=device)


def cuda_error_left() -> int:
    """cudaGetLastError() of the CUDA runtime PyTorch loaded (0: none left behind)."""
    import ctypes

    with open("/proc/self/maps") as maps:
        cudart = next(line.split()[-1] for line in maps if "libcudart.so" in line)
    return ctypes.CDLL(cudart).cudaGetLastError()


def build(depth: int, tiny: bool, seed: int = 0):
    """A Flux model of `depth` double blocks (2x single blocks); `tiny`: narrow, for CPU runs."""
    import torch

    import comfy.supported_models

    cfg = dict(image_model="flux", in_channels=16, patch_size=2, out_channels=16, vec_in_dim=768, context_in_dim=4096,
               hidden_size=3072, mlp_ratio=4.0, num_heads=24, depth=depth, depth_single_blocks=2 * depth,
               axes_dim=[16, 56, 56], theta=10000, qkv_bias=True, guidance_embed=True)
    if tiny:
        cfg.update(hidden_size=256, num_heads=2, context_in_dim=64, vec_in_dim=32)
    import dataclasses

    import comfy.ldm.flux.model

    if "txt_ids_dims" in {f.name for f in dataclasses.fields(comfy.ldm.flux.model.FluxParams)}:
        cfg["txt_ids_dims"] = []  # ComfyUI 0.33's FluxParams has this field; 0.3.75's has not
    config = comfy.supported_models.Flux(cfg)
    config.set_inference_dtype(torch.bfloat16, None)
    model = config.get_model({}, "")
    fill_random(model, seed)
    return model, cfg


def fill_random(model, seed: int = 0):
    """Seeded normal values, std 0.02, a different stream per tensor: a weight handed to the
    wrong layer or read at a wrong offset changes the output. Filled on the GPU where there is
    one (24 GB of CPU randn takes minutes) and copied back."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.no_grad():
        for index, p in enumerate(model.parameters()):
            g = torch.Generator(device=device).manual_seed(seed * 100_003 + index)
            values = torch.randn(p.shape, generator=g, device=device, dtype=torch.float32).mul_(0.02)
            p.copy_(values.to(p.dtype))


def finite(output) -> bool:
    """No NaN or inf in a forward output (random weights must keep activations in range)."""
    import torch

    return bool(torch.isfinite(output).all())

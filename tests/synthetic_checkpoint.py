"""A small, random-weight checkpoint that ComfyUI 0.3.75 loads as a Stable Diffusion 1.5 model.

ComfyUI reads the UNet's layout from the weights (comfy/model_detection.py: detect_unet_config),
and picks SD15 from comfy/supported_models.py when model_channels == 320, context_dim == 768,
no linear proj_in and no label embedding. So a *shallow* UNet (one resolution level, one res
block, one transformer block, plus the middle block) is detected as SD1.5 and runs through the
real SD1.5 code path, while the text encoder (CLIP-L, comfy/sd1_clip_config.json) and the VAE
(comfy/sd.py: the default SD VAE config) have fixed shapes and are written in full. Every tensor
is present, so ComfyUI reports no missing keys (except the ones it ignores for any SD1.5 file:
text_projection / logit_scale).

Sizes in fp16: UNet ~26 M params, CLIP-L 123 M, VAE 84 M: about 470 MB. `vae="taesd"` swaps in
ComfyUI's tiny autoencoder (also loaded from a checkpoint's first_stage_model.* keys) for ~250 MB.

Every tensor (biases and norms included) is random, so a test can tell a corrupted copy of any
weight from the original. Each tensor has its own RNG stream keyed on (seed, tensor name), and the
safetensors writer orders tensors deterministically: the same seed gives the same bytes.
Weights are drawn N(0, 1/fan_in) so activations keep their scale and sampling stays finite.

CLI:  python tests/synthetic_checkpoint.py OUT.safetensors [--seed N] [--vae kl|taesd]
      python tests/synthetic_checkpoint.py OUT.safetensors --check COMFY_DIR
        (--check loads it in-process with ComfyUI, samples 1 step at 64x64, decodes, and fails
         on missing keys or non-finite numbers; COMFY_DIR is e.g. .comfy/ComfyUI)
"""
import os
import sys
import zlib

import numpy as np

# Tensor kinds: how each one is filled.
W, B, NORM_W, NORM_B, EMB = "w", "b", "norm_w", "norm_b", "emb"


# ---- UNet (LDM key layout, prefix model.diffusion_model.) ---------------------------------------
CH, TEMB, CTX = 320, 1280, 768  # model_channels, time-embedding width, CLIP-L width


def _resblock(p, c_in, c_out):
    yield from [(p + "in_layers.0.weight", (c_in,), NORM_W), (p + "in_layers.0.bias", (c_in,), NORM_B),
                (p + "in_layers.2.weight", (c_out, c_in, 3, 3), W), (p + "in_layers.2.bias", (c_out,), B),
                (p + "emb_layers.1.weight", (c_out, TEMB), W), (p + "emb_layers.1.bias", (c_out,), B),
                (p + "out_layers.0.weight", (c_out,), NORM_W), (p + "out_layers.0.bias", (c_out,), NORM_B),
                (p + "out_layers.3.weight", (c_out, c_out, 3, 3), W), (p + "out_layers.3.bias", (c_out,), B)]
    if c_in != c_out:
        yield from [(p + "skip_connection.weight", (c_out, c_in, 1, 1), W), (p + "skip_connection.bias", (c_out,), B)]


def _spatial_transformer(p, c):
    # use_linear_in_transformer=False (SD1.5): proj_in/proj_out are 1x1 convolutions.
    yield from [(p + "norm.weight", (c,), NORM_W), (p + "norm.bias", (c,), NORM_B),
                (p + "proj_in.weight", (c, c, 1, 1), W), (p + "proj_in.bias", (c,), B)]
    t = p + "transformer_blocks.0."
    for attn, kv_dim in (("attn1", c), ("attn2", CTX)):  # self-attention, cross-attention on the text
        yield from [(t + attn + ".to_q.weight", (c, c), W), (t + attn + ".to_k.weight", (c, kv_dim), W),
                    (t + attn + ".to_v.weight", (c, kv_dim), W),
                    (t + attn + ".to_out.0.weight", (c, c), W), (t + attn + ".to_out.0.bias", (c,), B)]
    yield from [(t + "ff.net.0.proj.weight", (8 * c, c), W), (t + "ff.net.0.proj.bias", (8 * c,), B),  # GEGLU: 2 x 4c
                (t + "ff.net.2.weight", (c, 4 * c), W), (t + "ff.net.2.bias", (c,), B)]
    for n in ("norm1", "norm2", "norm3"):
        yield from [(t + n + ".weight", (c,), NORM_W), (t + n + ".bias", (c,), NORM_B)]
    yield from [(p + "proj_out.weight", (c, c, 1, 1), W), (p + "proj_out.bias", (c,), B)]


def unet_tensors(p="model.diffusion_model."):
    # Detected as: channel_mult [1], num_res_blocks [1], transformer_depth [1],
    # transformer_depth_output [1, 1], transformer_depth_middle 1.
    yield from [(p + "time_embed.0.weight", (TEMB, CH), W), (p + "time_embed.0.bias", (TEMB,), B),
                (p + "time_embed.2.weight", (TEMB, TEMB), W), (p + "time_embed.2.bias", (TEMB,), B),
                (p + "input_blocks.0.0.weight", (CH, 4, 3, 3), W), (p + "input_blocks.0.0.bias", (CH,), B)]
    yield from _resblock(p + "input_blocks.1.0.", CH, CH)
    yield from _spatial_transformer(p + "input_blocks.1.1.", CH)
    yield from _resblock(p + "middle_block.0.", CH, CH)
    yield from _spatial_transformer(p + "middle_block.1.", CH)
    yield from _resblock(p + "middle_block.2.", CH, CH)
    for i in range(2):  # num_res_blocks + 1 output blocks, each takes a skip connection (concat)
        yield from _resblock(p + f"output_blocks.{i}.0.", 2 * CH, CH)
        yield from _spatial_transformer(p + f"output_blocks.{i}.1.", CH)
    yield from [(p + "out.0.weight", (CH,), NORM_W), (p + "out.0.bias", (CH,), NORM_B),
                (p + "out.2.weight", (4, CH, 3, 3), W), (p + "out.2.bias", (4,), B)]


# ---- CLIP-L text encoder (Hugging Face layout, prefix cond_stage_model.transformer.text_model.) --
def clip_tensors(p="cond_stage_model.transformer.text_model.", d=768, layers=12, mlp=3072, vocab=49408, ctx=77):
    yield from [(p + "embeddings.token_embedding.weight", (vocab, d), EMB),
                (p + "embeddings.position_embedding.weight", (ctx, d), EMB)]
    for i in range(layers):
        q = f"{p}encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            yield from [(q + f"self_attn.{proj}.weight", (d, d), W), (q + f"self_attn.{proj}.bias", (d,), B)]
        yield from [(q + "layer_norm1.weight", (d,), NORM_W), (q + "layer_norm1.bias", (d,), NORM_B),
                    (q + "mlp.fc1.weight", (mlp, d), W), (q + "mlp.fc1.bias", (mlp,), B),
                    (q + "mlp.fc2.weight", (d, mlp), W), (q + "mlp.fc2.bias", (d,), B),
                    (q + "layer_norm2.weight", (d,), NORM_W), (q + "layer_norm2.bias", (d,), NORM_B)]
    yield from [(p + "final_layer_norm.weight", (d,), NORM_W), (p + "final_layer_norm.bias", (d,), NORM_B)]


# ---- VAE: the default SD AutoencoderKL (ch 128, ch_mult 1,2,4,4, 2 res blocks), LDM layout --------
def _vae_resnet(p, c_in, c_out):
    yield from [(p + "norm1.weight", (c_in,), NORM_W), (p + "norm1.bias", (c_in,), NORM_B),
                (p + "conv1.weight", (c_out, c_in, 3, 3), W), (p + "conv1.bias", (c_out,), B),
                (p + "norm2.weight", (c_out,), NORM_W), (p + "norm2.bias", (c_out,), NORM_B),
                (p + "conv2.weight", (c_out, c_out, 3, 3), W), (p + "conv2.bias", (c_out,), B)]
    if c_in != c_out:
        yield from [(p + "nin_shortcut.weight", (c_out, c_in, 1, 1), W), (p + "nin_shortcut.bias", (c_out,), B)]


def _vae_mid(p, c):
    yield from _vae_resnet(p + "block_1.", c, c)
    yield from [(p + "attn_1.norm.weight", (c,), NORM_W), (p + "attn_1.norm.bias", (c,), NORM_B)]
    for n in ("q", "k", "v", "proj_out"):
        yield from [(p + f"attn_1.{n}.weight", (c, c, 1, 1), W), (p + f"attn_1.{n}.bias", (c,), B)]
    yield from _vae_resnet(p + "block_2.", c, c)


def _conv(name, c_out, c_in, k=3, bias=True):
    yield (name + ".weight", (c_out, c_in, k, k), W)
    if bias:
        yield (name + ".bias", (c_out,), B)


def vae_kl_tensors(p="first_stage_model.", ch=128, mult=(1, 2, 4, 4), z=4):
    chans = [ch * m for m in mult]
    yield from _conv(p + "encoder.conv_in", ch, 3)
    c_in = ch
    for i, c in enumerate(chans):
        for j in range(2):
            yield from _vae_resnet(p + f"encoder.down.{i}.block.{j}.", c_in, c)
            c_in = c
        if i < len(chans) - 1:
            yield from _conv(p + f"encoder.down.{i}.downsample.conv", c, c)
    yield from _vae_mid(p + "encoder.mid.", c_in)
    yield from [(p + "encoder.norm_out.weight", (c_in,), NORM_W), (p + "encoder.norm_out.bias", (c_in,), NORM_B)]
    yield from _conv(p + "encoder.conv_out", 2 * z, c_in)  # mean and log-variance
    yield from _conv(p + "quant_conv", 2 * z, 2 * z, k=1)
    yield from _conv(p + "post_quant_conv", z, z, k=1)
    yield from _conv(p + "decoder.conv_in", chans[-1], z)
    yield from _vae_mid(p + "decoder.mid.", chans[-1])
    c_in = chans[-1]
    for i in reversed(range(len(chans))):  # decoder.up.{i} is built from the deepest level up
        for j in range(3):
            yield from _vae_resnet(p + f"decoder.up.{i}.block.{j}.", c_in, chans[i])
            c_in = chans[i]
        if i > 0:
            yield from _conv(p + f"decoder.up.{i}.upsample.conv", c_in, c_in)
    yield from [(p + "decoder.norm_out.weight", (ch,), NORM_W), (p + "decoder.norm_out.bias", (ch,), NORM_B)]
    yield from _conv(p + "decoder.conv_out", 3, ch)


# ---- VAE alternative: TAESD (comfy/taesd/taesd.py), ~2.4 M params --------------------------------
def vae_taesd_tensors(p="first_stage_model."):
    def block(q):  # conv, relu, conv, relu, conv (all 64 -> 64, so no skip conv)
        for k in (0, 2, 4):
            yield from _conv(f"{q}conv.{k}", 64, 64)
    e = p + "taesd_encoder."
    yield from _conv(e + "0", 64, 3)
    for i in range(1, 14):
        if i in (2, 6, 10):
            yield from _conv(f"{e}{i}", 64, 64, bias=False)  # stride-2 downsampling conv
        else:
            yield from block(f"{e}{i}.")
    yield from _conv(e + "14", 4, 64)
    d = p + "taesd_decoder."
    yield from _conv(d + "1", 64, 4)
    for i in (3, 4, 5, 8, 9, 10, 13, 14, 15, 18):
        yield from block(f"{d}{i}.")
    for i in (7, 12, 17):
        yield from _conv(f"{d}{i}", 64, 64, bias=False)  # conv after each 2x upsample
    yield from _conv(d + "19", 3, 64)
    # ComfyUI's VAELoader adds these for SD1 TAESD files; SD1's latent scale factor.
    yield (p + "vae_scale", (), 0.18215)
    yield (p + "vae_shift", (), 0.0)


def checkpoint_tensors(vae="kl"):
    yield from unet_tensors()
    yield from clip_tensors()
    yield from (vae_kl_tensors() if vae == "kl" else vae_taesd_tensors())


def _fill(name, shape, kind, seed):
    # One independent stream per tensor: results don't depend on enumeration order.
    if isinstance(kind, float):  # a constant
        return np.full(shape, kind, np.float16)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    x = rng.standard_normal(shape, dtype=np.float32)
    if kind == W:
        x *= 1.0 / np.sqrt(np.prod(shape[1:]))  # fan_in = in_channels * kernel area
    elif kind == NORM_W:
        x = 1.0 + 0.02 * x
    else:  # biases, norm shifts, embeddings: small, like trained models
        x *= 0.02
    return x.astype(np.float16)


# Quantized layouts of the UNet's linear weights, as downloaded files store them (ComfyUI
# quantizes Linear layers only): "scaled_fp8" is the legacy layout (float8_e4m3fn weights, a
# per-tensor `scale_weight`, a `<prefix>scaled_fp8` marker) that ComfyUI 0.33 turns into
# comfy_quant metadata; "fp8" and "int8" carry that metadata themselves (a per-layer
# `comfy_quant` JSON tensor and a `weight_scale`), the layouts of comfy-kitchen.
QUANTS = (None, "scaled_fp8", "fp8", "int8")


def _quantize(name, x, quant):
    """{key: torch tensor} for one UNet linear weight `x` (float32 numpy) in layout `quant`."""
    import json

    import torch

    layer = name[:-len(".weight")]
    w = torch.from_numpy(x)
    if quant == "int8":
        scale = w.abs().max() / 127.0
        q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
        conf = {"format": "int8_tensorwise"}
    else:
        scale = w.abs().max() / 448.0
        q = (w / scale).to(torch.float8_e4m3fn)
        conf = {"format": "float8_e4m3fn"}
    scale = scale.reshape(()).to(torch.float32)
    if quant == "scaled_fp8":  # with the input scale of 1 such files carry (no input scaling)
        return {name: q, layer + ".scale_weight": scale, layer + ".scale_input": torch.ones((), dtype=torch.float32)}
    return {name: q, layer + ".weight_scale": scale,
            layer + ".comfy_quant": torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)}


def make_checkpoint(path, seed=0, vae="kl", quant=None):
    """Write the synthetic SD1.5 checkpoint to `path` (fp16 safetensors). Returns the path.

    Deterministic: the same (seed, vae, quant) gives the same bytes. vae: "kl" (default SD VAE)
    or "taesd"; quant: one of QUANTS (the UNet's linear weights quantized, the rest fp16).
    """
    if vae not in ("kl", "taesd"):
        raise ValueError(f"vae must be 'kl' or 'taesd', not {vae!r}")
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {QUANTS}, not {quant!r}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    if quant is None:
        from safetensors.numpy import save_file

        tensors = {name: _fill(name, shape, kind, seed) for name, shape, kind in checkpoint_tensors(vae)}
        assert len(tensors) == sum(1 for _ in checkpoint_tensors(vae)), "duplicate tensor name"
        save_file(tensors, tmp)  # header lists tensors in a fixed order: byte-identical output
    else:
        import torch
        from safetensors.torch import save_file

        tensors = {}
        unet = {name for name, _, _ in unet_tensors()}
        for name, shape, kind in checkpoint_tensors(vae):
            x = _fill(name, shape, kind, seed)
            if name in unet and kind == W and len(shape) == 2:
                tensors.update(_quantize(name, x.astype(np.float32), quant))
            else:
                tensors[name] = torch.from_numpy(x)
        if quant == "scaled_fp8":
            tensors["model.diffusion_model.scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
        save_file(tensors, tmp)
    os.replace(tmp, path)    # never leave a half-written checkpoint behind
    return path


def make_gguf(path, seed=0):
    """The synthetic UNet as a GGUF file the way ComfyUI-GGUF's UnetLoaderGGUF reads it
    (architecture "sd1", keys without the "model.diffusion_model." prefix): linear weights in
    Q8_0 blocks, convolutions in F16, the rest F32. Deterministic. Returns the path."""
    import gguf

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    writer = gguf.GGUFWriter(tmp, "sd1")
    prefix = "model.diffusion_model."
    for name, shape, kind in unet_tensors():
        x = _fill(name, shape, kind, seed).astype(np.float32)
        key = name[len(prefix):]
        if kind == W and len(shape) == 2:
            q8 = gguf.GGMLQuantizationType.Q8_0
            data = gguf.quants.quantize(x, q8)
            writer.add_tensor(key, data, raw_shape=data.shape, raw_dtype=q8)
        elif len(shape) == 4:
            writer.add_tensor(key, x.astype(np.float16))
        else:
            writer.add_tensor(key, x)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def make_lora(path, seed=1, rank=4, scale=0.5):
    """A LoRA for the synthetic checkpoint's UNet (kohya key names, which ComfyUI maps to the
    LDM keys: lora_unet_<key without "diffusion_model." and ".weight", dots as underscores>):
    an up/down pair and alpha for every linear (2-D) UNet weight. Deterministic like the
    checkpoint. Returns the path."""
    from safetensors.numpy import save_file

    tensors = {}
    for name, shape, kind in unet_tensors():
        if kind != W or len(shape) != 2:
            continue
        base = "lora_unet_" + name[len("model.diffusion_model."):-len(".weight")].replace(".", "_")
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        tensors[base + ".lora_up.weight"] = (rng.standard_normal((shape[0], rank)) * scale / np.sqrt(rank)).astype(np.float16)
        tensors[base + ".lora_down.weight"] = (rng.standard_normal((rank, shape[1])) / np.sqrt(shape[1])).astype(np.float16)
        tensors[base + ".alpha"] = np.array(float(rank), np.float16)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    save_file(tensors, tmp)
    os.replace(tmp, path)
    return path


def check_in_comfy(path, comfy_dir):
    """Load `path` with ComfyUI in this process, sample 1 step at 64x64, decode; raise on trouble."""
    import logging
    sys.argv = [sys.argv[0], "--cpu"]  # comfy.cli_args parses sys.argv when imported
    sys.path.insert(0, os.path.abspath(comfy_dir))
    import torch
    import comfy.options
    comfy.options.enable_args_parsing()
    import comfy.sd, comfy.sample, comfy.samplers, comfy.model_detection  # noqa: E401

    warnings = []
    handler = logging.Handler()
    handler.emit = lambda rec: warnings.append(rec.getMessage()) if rec.levelno >= logging.WARNING else None
    logging.getLogger().addHandler(handler)
    model, clip, vae, _ = comfy.sd.load_checkpoint_guess_config(path)
    kind = type(model.model.model_config).__name__
    bad = [w for w in warnings if "missing" in w or "unexpected" in w or "no match" in w]
    assert kind == "SD15" and not bad, (kind, bad)
    cond = [[clip.encode_from_tokens(clip.tokenize("a photo of a viking ship"), return_pooled=False), {}]]
    uncond = [[clip.encode_from_tokens(clip.tokenize(""), return_pooled=False), {}]]
    latent = torch.zeros(1, 4, 8, 8)
    noise = comfy.sample.prepare_noise(latent, 0)
    out = comfy.sample.sample(model, noise, 2, 7.0, "euler", "normal", cond, uncond, latent, disable_pbar=True)
    image = vae.decode(out)
    for name, t in (("cond", cond[0][0]), ("latent", out), ("image", image)):
        assert torch.isfinite(t).all(), f"{name} is not finite"
    print(f"ok: detected {kind}; latent std {out.std():.3f}; image {tuple(image.shape)} "
          f"mean {image.mean():.3f} std {image.std():.3f}")


if __name__ == "__main__":
    import argparse
    import time

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vae", choices=("kl", "taesd"), default="kl")
    ap.add_argument("--quant", choices=[q for q in QUANTS if q], default=None)
    ap.add_argument("--check", metavar="COMFY_DIR", help="load and sample it in-process with this ComfyUI")
    a = ap.parse_args()
    t0 = time.time()
    make_checkpoint(a.path, a.seed, a.vae, a.quant)
    print(f"wrote {a.path}: {os.path.getsize(a.path) / 1e6:.1f} MB in {time.time() - t0:.1f} s")
    if a.check:
        check_in_comfy(a.path, a.check)

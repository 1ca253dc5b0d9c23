"""Zero-copy token embeddings (issue 60) against ComfyUI's own path, on a CUDA GPU, in ComfyUI
0.3.75's model management (static mode), in process.

The text encoder is a synthetic Llama 3.1 8B-shaped one built with ComfyUI's own classes
(comfy.text_encoders.llama.Llama2, comfy.ops.manual_cast): the real 128,256 x 4,096 bf16
token table (1.05 GB) and `--layers` of the real decoder layers (218 M parameters each), random
weights. Beside it a diffusion model stand-in: `--diffusion-gib` of bf16 comfy.ops Linear layers,
whose "step" runs them all. One process per mode, the same seeded weights and inputs in each:
  comfy     ComfyUI alone;
  pinned    Viking pins the encoder (CUDA registration), tables copied to VRAM as ComfyUI does;
  zerocopy  the same, the token table read in place from the pins (zero_copy.apply).
Cases, in each process:
  fits      plenty of VRAM: VRAM the encoder holds once loaded, and the encode time of a prompt
            (256 tokens) with the encoder loaded;
  encoder_lowvram   free VRAM held to `--encoder-vram-gib`: ComfyUI loads the encoder in part and
            streams the rest at each call (its table too);
  prompt_short      free VRAM held to `--prompt-vram-gib`: whole prompts, encode then
            `--steps` diffusion steps, the encoder and the diffusion model taking turns in VRAM;
            seconds per prompt and how much of the diffusion model ComfyUI placed in VRAM.
The conditioning (and the steps' output) of every case is hashed: each mode must give the same
bytes as ComfyUI alone.

usage: python bench/zero_copy.py COMFY_DIR OUT.json [--layers 1] [--reps 10] [--prompts 3] [--modes comfy,pinned,zerocopy]
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GIB = 1 << 30
MODES = ("comfy", "pinned", "zerocopy")


def sha(tensor) -> str:
    """The first 16 hex digits of the SHA-256 of a tensor's bytes."""
    import torch

    return hashlib.sha256(tensor.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def run_mode(mode, args):
    sys.path[:0] = [args.comfy_dir, REPO]
    sys.argv = [sys.argv[0]]
    import torch
    import comfy.options
    comfy.options.enable_args_parsing()
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.ops
    from comfy.text_encoders.llama import Llama2

    ops = comfy.ops.manual_cast
    config = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=args.layers,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5,
                  rope_theta=500000.0)
    encoder = Llama2(config, dtype=torch.bfloat16, device="cpu", operations=ops)

    class Diffusion(torch.nn.Module):  # the stand-in: square bf16 Linear layers, run in turn
        def __init__(self, width, count):
            super().__init__()
            self.layers = torch.nn.ModuleList(ops.Linear(width, width, bias=False, dtype=torch.bfloat16, device="cpu")
                                              for _ in range(count))

        def forward(self, x):
            for layer in self.layers:
                x = torch.nn.functional.silu(layer(x))
            return x

    width = 8192
    diffusion = Diffusion(width, max(1, int(args.diffusion_gib * GIB // (width * width * 2))))
    # Seeded random weights (made on the GPU, in the same order in every process).
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for model in (encoder, diffusion):
            for parameter in model.parameters():
                scale = 1.0 if parameter.dim() == 2 and parameter.shape[0] == 128256 else parameter.shape[-1] ** -0.5
                filled = torch.randn(parameter.shape, generator=generator, device="cuda", dtype=torch.float32).mul_(scale)
                parameter.data.copy_(filled.to(torch.bfloat16).cpu())
                del filled
    torch.cuda.empty_cache()
    device = mm.get_torch_device()
    encoder_patcher = comfy.model_patcher.ModelPatcher(encoder, load_device=device, offload_device=torch.device("cpu"))
    diffusion_patcher = comfy.model_patcher.ModelPatcher(diffusion, load_device=device, offload_device=torch.device("cpu"))
    table_bytes = encoder.model.embed_tokens.weight.nbytes
    result = dict(mode=mode, encoder_bytes=int(encoder_patcher.model_size()), table_bytes=int(table_bytes),
                  diffusion_bytes=int(diffusion_patcher.model_size()), layers=args.layers, cases={})
    notes = []
    if mode != "comfy":
        from comfy_node import lifecycle, zero_copy
        from comfy_node.native import require
        native = require()
        started = time.perf_counter()
        report = lifecycle.attach(encoder_patcher, lifecycle.PinSettings(label="encoder", backend="cuda", headroom_gib=8.0))
        result["pin_s"] = round(time.perf_counter() - started, 3)
        result["pinned_bytes"] = report["pinned_bytes"]
        if mode == "zerocopy":
            notes = zero_copy.apply(encoder_patcher, True)
        result["notes"] = notes
    tokens = torch.randint(0, 128256, (1, 256), generator=torch.Generator().manual_seed(1))

    def encode():
        with torch.inference_mode():
            ids = tokens.to(device)
            out = encoder_patcher.model(ids, dtype=torch.float32)
            return out[0] if isinstance(out, tuple) else out

    def timed(call):
        torch.cuda.synchronize()
        started = time.perf_counter()
        out = call()
        torch.cuda.synchronize()
        return time.perf_counter() - started, out

    def settle():
        mm.unload_all_models()
        mm.soft_empty_cache()
        torch.cuda.synchronize()

    def hold(free_gib):
        free, _ = torch.cuda.mem_get_info()
        return torch.empty(max(0, free - int(free_gib * GIB)), dtype=torch.uint8, device="cuda")

    # fits: VRAM held by the encoder at load, encode time with it loaded.
    settle()
    before = torch.cuda.memory_allocated()
    load_s, _ = timed(lambda: mm.load_models_gpu([encoder_patcher]))
    held = torch.cuda.memory_allocated() - before
    times, out = [], None
    for i in range(3 + args.reps):
        seconds, out = timed(encode)
        if i >= 3:
            times.append(seconds)
    result["cases"]["fits"] = dict(load_s=round(load_s, 3), encoder_vram_bytes=int(held),
                                   comfy_loaded_bytes=int(encoder_patcher.loaded_size()),
                                   comfy_model_size=int(encoder_patcher.model_size()),
                                   encode_s=[round(t, 5) for t in times], encode_s_median=round(statistics.median(times), 5),
                                   conditioning=sha(out))

    # encoder_lowvram: the encoder does not fit; ComfyUI streams what it left in RAM.
    settle()
    dummy = hold(args.encoder_vram_gib)
    mm.load_models_gpu([encoder_patcher])
    times = []
    for i in range(2 + args.reps // 2):
        seconds, out = timed(encode)
        if i >= 2:
            times.append(seconds)
    result["cases"]["encoder_lowvram"] = dict(free_vram_gib=args.encoder_vram_gib, comfy_loaded_bytes=int(encoder_patcher.loaded_size()),
                                              encode_s=[round(t, 5) for t in times],
                                              encode_s_median=round(statistics.median(times), 5), conditioning=sha(out))
    del dummy
    settle()

    # prompt_short: whole prompts, the encoder beside the diffusion model in short VRAM.
    dummy = hold(args.prompt_vram_gib)
    x = torch.randn(64, width, generator=torch.Generator().manual_seed(2), dtype=torch.bfloat16).to(device)
    prompts, loaded, conditioning, latent = [], [], None, None
    for i in range(1 + args.prompts):
        def prompt():
            mm.load_models_gpu([encoder_patcher])
            cond = encode()
            mm.load_models_gpu([diffusion_patcher])
            h = x + cond[0, :64, :].to(torch.bfloat16).repeat(1, width // 4096)
            with torch.inference_mode():
                for _ in range(args.steps):
                    h = diffusion_patcher.model(h)
            return cond, h
        seconds, (conditioning, latent) = timed(prompt)
        if i >= 1:
            prompts.append(seconds)
            loaded.append(int(diffusion_patcher.loaded_size()))
    result["cases"]["prompt_short"] = dict(free_vram_gib=args.prompt_vram_gib, steps=args.steps,
                                           prompt_s=[round(t, 4) for t in prompts], prompt_s_median=round(statistics.median(prompts), 4),
                                           diffusion_loaded_bytes=loaded, encoder_loaded_bytes=int(encoder_patcher.loaded_size()),
                                           conditioning=sha(conditioning), output=sha(latent))
    del dummy
    settle()
    if mode == "zerocopy":
        from comfy_node import zero_copy
        result["restored_tables"] = zero_copy.restore(encoder_patcher)
        result["status_after_restore"] = {k: json.loads(native.status_json())[k] for k in ("pinned_bytes",)}
    print("RESULT " + json.dumps(result), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("comfy_dir")
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--diffusion-gib", type=float, default=3.5)
    parser.add_argument("--encoder-vram-gib", type=float, default=1.5)
    parser.add_argument("--prompt-vram-gib", type=float, default=6.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.mode:
        run_mode(args.mode, args)
        return
    results = {}
    for mode in args.modes.split(","):
        started = time.perf_counter()
        run = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", mode], capture_output=True, text=True, timeout=900)
        line = next((l for l in run.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            results[mode] = {"error": (run.stdout[-2000:] + run.stderr[-4000:])}
        else:
            results[mode] = json.loads(line[len("RESULT "):])
        results[mode]["process_s"] = round(time.perf_counter() - started, 1)
        print(mode, json.dumps(results[mode])[:1500], flush=True)
    import torch
    summary = {}
    base = results.get("comfy", {}).get("cases", {})
    for mode, result in results.items():
        cases = result.get("cases", {})
        if not cases or not base:
            continue
        summary[mode] = {
            "encoder_vram_bytes": cases["fits"]["encoder_vram_bytes"],
            "encode_vs_comfy_fits": round(cases["fits"]["encode_s_median"] / base["fits"]["encode_s_median"], 3),
            "encode_vs_comfy_lowvram": round(cases["encoder_lowvram"]["encode_s_median"] / base["encoder_lowvram"]["encode_s_median"], 3),
            "prompt_vs_comfy_short": round(cases["prompt_short"]["prompt_s_median"] / base["prompt_short"]["prompt_s_median"], 3),
            "bit_identical": all(cases[c]["conditioning"] == base[c]["conditioning"] for c in base)
                             and cases["prompt_short"]["output"] == base["prompt_short"]["output"],
        }
    out = {"bench": "zero_copy", "date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0),
           "args": {k: v for k, v in vars(args).items() if k not in ("mode", "out")}, "summary": summary, "modes": results}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

"""ComfyUI 0.33's dynamic VRAM mode (its default on NVIDIA) alone and with Viking, on a real
server: a Flux-shaped diffusion model (flux_model.build, seeded random bf16) saved as
safetensors and loaded by ComfyUI's UNETLoader, so the dynamic path maps it from the file;
VRAM held down by another process (--free-gib free). The conditioning comes from a small node
this bench writes into the server's custom_nodes (seeded random tensors of Flux's shapes: the
text encoders are not what is measured).

Modes, each a fresh server, named by what they add to "dynamic" (ComfyUI alone):
  _nodes    Viking Pin Model between the loader and the sampler
  _engine   VIKING_ENGINE_MODE=1, no node
  _clone    a plain node that returns model.clone() (no Viking): what any node that hands the
            sampler a patched clone (a LoRA loader) costs ComfyUI itself
  _fastdisk ComfyUI's --fast-disk (weights with a VRAM slot stream from the file mapping each
            time instead of a pinned staging copy: the case where the file's pages are what a
            step reads, and what residency keeps); compared with dynamic_fastdisk alone
  _two      two models taking turns in one prompt (the second file's weights seeded apart; a
            sampler on each, the second refining the first's latent, as Wan 2.2's two experts
            or a base + refiner graph do): each model's turn gives the other's VRAM slots
            away; compared with dynamic[_fastdisk]_two alone
  static    --disable-dynamic-vram alone: ComfyUI's static path at the same VRAM
  static_nodes  --disable-dynamic-vram with the node: the cross-check
  #N        the same mode again, a later fresh server (ComfyUI alone twice: the noise floor
            between servers)
Per server: the first prompt from a
cold start (the files' pages dropped from the page cache first), five warm prompts, then memory
pressure (the files' page cache dropped with posix_fadvise(DONTNEED), the server's mappings
of them paged out with process_madvise(MADV_PAGEOUT)) and one more prompt. Recorded: seconds per
prompt, peak RSS (VmHWM), PSS after each prompt (a page mapped twice, by aimdo and by Viking's
view, counts once there; RSS counts it twice), Viking's and ComfyUI's pinned bytes, ComfyUI's
pin ceiling, the bytes read from storage per prompt (/proc/PID/io: what a slower disk would
make slower), the latent's hash (bit-identity across modes).

Formats (--format): bf16 (default); fp8_scaled, the legacy layout most Flux / Wan files ship in
(every linear weight float8_e4m3fn with a per-tensor scale_weight and the scaled_fp8 marker;
ComfyUI 0.33 loads them as comfy-kitchen QuantizedTensor weights); comfy_quant, the layout of
comfy-kitchen's own files (float8_e4m3fn with a per-layer `comfy_quant` format tensor and a
`weight_scale`: the newer fp8 and nvfp4 downloads); gguf, every linear weight in
Q8_0 blocks, loaded through the real ComfyUI-GGUF pack (tests/hosts.py) by its UnetLoaderGGUF.

usage: python bench/gpu_dynamic.py OUT.json [--depth 19] [--free-gib 16] [--steps 4] [--size 1024] [--modes A,B,...]
       [--format bf16|fp8_scaled|comfy_quant|gguf]
       [--cpu]  (a dry run of the bench itself on a machine with no GPU: its dynamic-mode checks fail there)
(run by ComfyUI 0.33's Python; writes the model file once under .comfy/cache)
"""

import ctypes
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO / "tests"), str(BENCH)]

from comfy_server import CACHE_DIR, ComfyServer, comfy_install, prepare_base_dir  # noqa: E402
from hosts import GGUF_PACK  # noqa: E402
from flux_model import arg  # noqa: E402
from server_tools import Results, bad_lines, drop_file_cache, hold_vram, run_seconds, status_bytes  # noqa: E402

out_path = sys.argv[1]
depth, free_gib, steps, size = arg("--depth", 19, int), arg("--free-gib", 16.0), arg("--steps", 4, int), arg("--size", 1024, int)
modes = arg("--modes", "dynamic,dynamic_nodes,dynamic_engine,static_nodes", str).split(",")
cpu = "--cpu" in sys.argv
weight_format = arg("--format", "bf16", str)
FORMAT_SUFFIX = {"bf16": ".safetensors", "fp8_scaled": "_fp8_scaled.safetensors", "comfy_quant": "_comfy_quant_fp8.safetensors",
                 "gguf": "_q8_0.gguf"}[weight_format]
MODELS = (f"flux_shaped_d{depth}{FORMAT_SUFFIX}", f"flux_shaped_d{depth}_seed1{FORMAT_SUFFIX}")  # the second for _two
WARM_PROMPTS = 5  # the warm figure is their median
libc = ctypes.CDLL(None, use_errno=True)
results = Results(out_path, bench="gpu_dynamic", date=time.strftime("%Y-%m-%d"), depth=depth, free_gib=free_gib, format=weight_format,
                  steps=steps, size=size, modes={})
result, check, save = results.data, results.check, results.save

BENCH_NODES = '''
import torch

class VikingBenchFluxConditioning:
    """Seeded random conditioning of Flux's shapes (T5 context 256x4096, pooled 768)."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "bench"

    def make(self, seed):
        g = torch.Generator().manual_seed(seed)
        context = torch.randn(1, 256, 4096, generator=g) * 0.5
        pooled = torch.randn(1, 768, generator=g) * 0.5
        return ([[context, {"pooled_output": pooled, "guidance": 3.5}]],)

class VikingBenchClone:
    """model.clone() and nothing else: what a node handing the sampler a clone costs."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "clone"
    CATEGORY = "bench"

    def clone(self, model):
        return (model.clone(),)

NODE_CLASS_MAPPINGS = {"VikingBenchFluxConditioning": VikingBenchFluxConditioning, "VikingBenchClone": VikingBenchClone}
'''


def model_file(name: str, seed: int) -> Path:
    path = CACHE_DIR / name
    if not path.exists():
        import safetensors.torch
        import flux_model

        flux_model.start_comfy(str(comfy_install("0.33").tree), cpu=cpu)
        model, _ = flux_model.build(depth, tiny=False, seed=seed)
        state = {k: v.contiguous() for k, v in model.diffusion_model.state_dict().items()}
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        if weight_format == "gguf":
            write_gguf(state, str(path) + ".part")
        else:
            if weight_format in ("fp8_scaled", "comfy_quant"):
                state = fp8_scaled(state, comfy_quant=weight_format == "comfy_quant")
            safetensors.torch.save_file(state, str(path) + ".part")
        os.replace(str(path) + ".part", path)
        del model, state
    return path


def linear_weight(key: str, tensor) -> bool:
    return key.endswith(".weight") and tensor.dim() == 2


def fp8_scaled(state: dict, comfy_quant: bool = False) -> dict:
    """Each linear weight as float8_e4m3fn divided by a per-tensor scale (its largest magnitude
    over fp8's 448). The legacy layout: the scale as `<layer>.scale_weight`, an input scale of 1,
    and the `scaled_fp8` marker. `comfy_quant`: comfy-kitchen's own layout instead, the scale as
    `<layer>.weight_scale` and the layer's format as a `<layer>.comfy_quant` JSON tensor."""
    import torch

    out = {}
    for key, tensor in state.items():
        if not linear_weight(key, tensor):
            out[key] = tensor
            continue
        layer = key[:-len(".weight")]
        on = tensor.to("cuda" if torch.cuda.is_available() else "cpu", torch.float32)
        scale = on.abs().max() / 448.0
        out[key] = (on / scale).to(torch.float8_e4m3fn).cpu()
        if comfy_quant:
            out[layer + ".weight_scale"] = scale.reshape(()).cpu()
            out[layer + ".comfy_quant"] = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()), dtype=torch.uint8)
        else:
            out[layer + ".scale_weight"] = scale.reshape(()).cpu()
            out[layer + ".scale_input"] = torch.ones((), dtype=torch.float32)
    if not comfy_quant:
        out["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    return out


def q8_0_blocks(tensor):
    """GGML's Q8_0 of a 2-D tensor: per 32 values an fp16 scale (largest magnitude / 127) and
    32 int8, as (rows, bytes per row) uint8; computed on the GPU where there is one."""
    import torch

    rows = tensor.shape[0]
    blocks = tensor.to("cuda" if torch.cuda.is_available() else "cpu", torch.float32).reshape(-1, 32)
    scale = blocks.abs().amax(1, keepdim=True) / 127
    quant = torch.where(scale > 0, blocks / scale, torch.zeros_like(blocks)).round().clamp(-127, 127).to(torch.int8)
    packed = torch.cat([scale.half().view(torch.uint8).reshape(-1, 2), quant.view(torch.uint8)], 1)
    return packed.reshape(rows, -1).cpu().numpy()


def write_gguf(state: dict, path: str):
    """The model as a GGUF file ComfyUI-GGUF's UnetLoaderGGUF reads (architecture flux): linear
    weights in Q8_0, the rest float32."""
    import gguf

    writer = gguf.GGUFWriter(path, "flux")
    for key, tensor in state.items():
        if linear_weight(key, tensor):
            data = q8_0_blocks(tensor)
            writer.add_tensor(key, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(key, tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def page_out_file(pid: int, path: Path) -> int:
    """process_madvise(MADV_PAGEOUT) on each mapping of `path` in `pid`; bytes advised."""
    pidfd = libc.syscall(434, pid, 0)  # pidfd_open
    advised = 0
    try:
        for line in open(f"/proc/{pid}/maps"):
            fields = line.split()
            if len(fields) >= 6 and fields[5] == str(path):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                vec = Iovec(start, end - start)
                done = libc.syscall(440, pidfd, ctypes.byref(vec), 1, 21, 0)  # process_madvise, MADV_PAGEOUT
                advised += max(0, done)
    finally:
        os.close(pidfd)
    return advised


def graph(mode: str, seed: int) -> dict:
    """One prompt: loader -> [Pin Model | clone] -> KSampler -> SaveLatent; with _two a second
    loader and sampler refine the first sampler's latent (both models sample in every prompt)."""
    wrap = "VikingPinModel" if mode_kind(mode) == "nodes" else "VikingBenchClone" if mode_kind(mode) == "clone" else None
    api = {"3": {"class_type": "VikingBenchFluxConditioning", "inputs": {"seed": 1}},
           "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}}}
    latent = ["4", 0]
    for index, name in enumerate(MODELS[:2 if "_two" in mode else 1]):
        loader, pin, sampler = (f"{10 * index + n}" for n in (1, 2, 5))
        api[loader] = ({"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": name}} if weight_format == "gguf" else
                       {"class_type": "UNETLoader", "inputs": {"unet_name": name, "weight_dtype": "default"}})
        model = [loader, 0]
        if wrap == "VikingPinModel":
            api[pin] = {"class_type": wrap, "inputs": {"model": model, "budget_gib": 0.0, "headroom_gib": 0.0, "backend": "auto",
                                                       "priority": 0, "pinned_home": True, "vram_cap_gib": 0.0,
                                                       "file_residency": "_nofile" not in mode}}
            model = [pin, 0]
        elif wrap is not None:
            api[pin] = {"class_type": wrap, "inputs": {"model": model}}
            model = [pin, 0]
        api[sampler] = {"class_type": "KSampler", "inputs": {"model": model, "positive": ["3", 0], "negative": ["3", 0],
                                                              "latent_image": latent, "seed": seed + index, "steps": steps,
                                                              "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
                                                              "denoise": 1.0 if index == 0 else 0.5}}
        latent = [sampler, 0]
    api["6"] = {"class_type": "SaveLatent", "inputs": {"samples": latent, "filename_prefix": f"s{seed}"}}
    return api


def latent_hash(server, entry) -> str | None:
    for node in entry.get("outputs", {}).values():
        for item in node.get("latents", []):
            folder = server.base_dir / "output" / item.get("subfolder", "")
            return hashlib.sha256((folder / item["filename"]).read_bytes()).hexdigest()
    return None


def mode_kind(mode: str) -> str:
    """What a mode adds to ComfyUI alone: "nodes", "engine", "clone" or "alone"."""
    base = mode.split("#")[0]
    return next((kind for kind in ("nodes", "engine", "clone") if base.endswith("_" + kind)), "alone")


def alone_mode(mode: str) -> str:
    """The ComfyUI-alone mode a mode is compared with (static_nodes: default dynamic alone)."""
    base = mode.split("#")[0]
    return "dynamic" + "".join(flag for flag in ("_fastdisk", "_two") if flag in base)


def proc_number(pid: int, file: str, field: str) -> int | None:
    """The first number after `field:` in /proc/PID/FILE."""
    for line in open(f"/proc/{pid}/{file}"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def pss_bytes(pid: int) -> int | None:
    kib = proc_number(pid, "smaps_rollup", "Pss")
    return kib * 1024 if kib is not None else None


def storage_read_bytes(pid: int) -> int:
    """Bytes the process has had read from storage (page-cache misses), /proc/PID/io."""
    return proc_number(pid, "io", "read_bytes") or 0


def run_mode(mode: str, paths: list[Path]) -> dict:
    base = Path(tempfile.mkdtemp(prefix=f"gpu_dynamic_{mode.replace('#', '_')}_"))
    with_viking = mode_kind(mode) in ("nodes", "engine")
    nodes = {"viking_engine": REPO} if with_viking else {}
    if weight_format == "gguf":
        nodes["ComfyUI-GGUF"] = GGUF_PACK
    prepare_base_dir(base, custom_nodes=nodes)
    (base / "custom_nodes" / "viking_bench_nodes").mkdir(exist_ok=True)
    (base / "custom_nodes" / "viking_bench_nodes" / "__init__.py").write_text(BENCH_NODES)
    (base / "models" / "diffusion_models").mkdir(parents=True, exist_ok=True)
    for path in paths:
        (base / "models" / "diffusion_models" / path.name).symlink_to(path)
    (base / "frontend").mkdir(exist_ok=True)
    extra = ["--disable-metadata", "--front-end-root", str(base / "frontend")]
    if mode.startswith("static"):
        extra.append("--disable-dynamic-vram")
    if "_fastdisk" in mode:
        extra.append("--fast-disk")
    env = {"VIKING_ENGINE_MODE": "1"} if mode_kind(mode) == "engine" else {}
    row = dict(prompts=[])
    for path in paths:
        drop_file_cache(path)
    with ComfyServer(base, extra, cpu=cpu, version="0.33", env=env, start_timeout=300) as server:
        for index, stage in enumerate(("cold start",) + ("warm",) * WARM_PROMPTS + ("after pressure",)):
            if stage == "after pressure":
                row["paged_out_bytes"] = sum(page_out_file(server.pid, path) for path in paths)
                for path in paths:
                    drop_file_cache(path)
            read_before = storage_read_bytes(server.pid)
            entry = server.run_prompt(graph(mode, seed=index), timeout=900)
            prompt = dict(stage=stage, seconds=run_seconds(entry), latent=latent_hash(server, entry), pss_bytes=pss_bytes(server.pid),
                          storage_read_bytes=storage_read_bytes(server.pid) - read_before)
            if with_viking:
                status = server.get("/viking/status")
                owners = [o for o in status["owners"] if "Flux" in o["label"] or o["label"].startswith("MODEL")]
                prompt.update(viking_pinned_bytes=status["pinned_bytes"], comfy=status.get("comfy"),
                              dynamic=[o.get("dynamic") for o in owners], notes=[o.get("notes") for o in owners],
                              model_pinned_bytes=[o["pinned_bytes"] for o in owners],
                              weights=[o.get("weights") for o in owners],  # bytes by kind (plain, quantized, gguf)
                              prefetch=[o.get("prefetch") for o in owners],  # static mode: its window, ComfyUI's buffers freed
                              budget=status["budget"]["reason"],
                              time_in_viking=status.get("time_in_viking"))  # since the server started: calls, seconds
            row["prompts"].append(prompt)
            print(mode, json.dumps(prompt), flush=True)
        row["peak_rss_bytes"] = status_bytes(server.pid, "VmHWM")
        log = server.log_path.read_text(errors="replace")
    row["bad_log_lines"] = bad_lines(log)
    row["dynamic_vram_on"] = "DynamicVRAM support detected and enabled" in log
    result["modes"][mode] = row
    save()
    return row


def stage_seconds(row: dict) -> dict:
    """Seconds per stage of one mode (warm: the median of its prompts)."""
    by_stage = {}
    for prompt in row["prompts"]:
        by_stage.setdefault(prompt["stage"], []).append(prompt["seconds"])
    return {stage: sorted(values)[len(values) // 2] for stage, values in by_stage.items()}


paths = [model_file(MODELS[0], seed=0)]
if any("_two" in mode for mode in modes):
    paths.append(model_file(MODELS[1], seed=1))
result["model_bytes"] = paths[0].stat().st_size
holder, held = hold_vram(free_gib) if not cpu else (None, 0)
result["held_vram_bytes"] = held
try:
    for mode in modes:
        try:
            run_mode(mode, paths if "_two" in mode else paths[:1])
        except Exception as error:  # noqa: BLE001 - recorded; the other modes still run
            # The head holds the failing node's exception (ComfyError), the tail ComfyUI's log.
            text = f"{type(error).__name__}: {error}"
            result["modes"][mode] = dict(prompts=[], error=text if len(text) <= 6000 else text[:3000] + "\n...\n" + text[-3000:])
            save()
            print(mode, "failed:", text[:3000], flush=True)
finally:
    if holder is not None:
        holder.kill()

failed = {mode: row["error"] for mode, row in result["modes"].items() if "error" in row}
for mode, text in failed.items():
    check(False, f"{mode}: every prompt ran: {' '.join(text.splitlines()[:2])[:300]}")  # ComfyError: its node's exception
rows = {mode: row for mode, row in result["modes"].items() if mode not in failed}
for mode, row in rows.items():
    hashes = [p["latent"] for p in row["prompts"]]
    # ComfyUI alone in the default dynamic mode where this file has it (--fast-disk must not change a latent either)
    reference_mode = alone_mode(mode).replace("_fastdisk", "") if alone_mode(mode).replace("_fastdisk", "") in rows else alone_mode(mode)
    reference = [p["latent"] for p in rows.get(reference_mode, row)["prompts"]]
    check(hashes == reference and None not in hashes, f"{mode}: latents bit-identical to {reference_mode} (ComfyUI dynamic alone)")
    check(not row["bad_log_lines"], f"{mode}: no CUDA error, Pin error or traceback in the log: {row['bad_log_lines'][:3]}")
    if mode.startswith("dynamic"):
        check(row["dynamic_vram_on"], f"{mode}: ComfyUI ran in dynamic VRAM mode")
summary = {}
for mode, row in rows.items():
    alone = rows.get(alone_mode(mode))
    if alone is None or mode == alone_mode(mode):
        continue
    mine, theirs = stage_seconds(row), stage_seconds(alone)
    ratios = {stage: round(mine[stage] / theirs[stage], 3) for stage in mine if mine[stage] and theirs.get(stage)}
    peak_pss = max(p["pss_bytes"] or 0 for p in row["prompts"]) / max(p["pss_bytes"] or 1 for p in alone["prompts"])
    summary[mode] = dict(compared_with=alone_mode(mode), seconds_over_alone=ratios,
                         peak_rss_over_alone=round(row["peak_rss_bytes"] / alone["peak_rss_bytes"], 3),
                         pss_over_alone=round(peak_pss, 3),
                         read_after_pressure_bytes=(row["prompts"][-1]["storage_read_bytes"], alone["prompts"][-1]["storage_read_bytes"]))
result["summary"] = summary
save()
print(json.dumps(summary, indent=1))
sys.exit(0 if result["ok"] else 1)

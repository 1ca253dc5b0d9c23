"""The weight formats users download, through ComfyUI's own loaders on a real server: a legacy
fp8-scaled checkpoint (how most Flux / Wan files ship), comfy_quant fp8 and int8 layers
(comfy-kitchen's QuantizedTensor on ComfyUI 0.33), a diffusion model through UNETLoader, and a
weight of a type nobody knows. With every Pin node and with engine mode: the prompt succeeds, the
quantized bytes are locked (VmLck of the server), the status counts bytes by kind, the image is
bit-identical to ComfyUI alone, and no Viking warning repeats."""
import re
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

from comfy_server import CACHE_DIR, REPO_ROOT, ComfyServer, pin_node, prepare_base_dir, txt2img_prompt
from comfy_free import free_until
from memory_probe import locked_bytes

FIXTURE_NODES = Path(__file__).resolve().parent / "fixtures" / "foreign_model_node"
# ComfyUI 0.3.75 reads the legacy fp8-scaled layout only; comfy_quant layers came with 0.33's
# comfy-kitchen (0.3.75 reports their keys as unexpected and loads the weights unscaled).
FORMATS = {"0.3.75": ["scaled_fp8"], "0.33": ["scaled_fp8", "fp8", "int8"]}


def quantized_checkpoint(quant: str) -> Path:
    import hashlib

    import synthetic_checkpoint

    src = hashlib.sha256(Path(synthetic_checkpoint.__file__).read_bytes()).hexdigest()[:10]
    path = CACHE_DIR / f"synthetic_sd15_taesd_{quant}_{src}.safetensors"
    if not path.exists():
        synthetic_checkpoint.make_checkpoint(str(path), seed=3, vae="taesd", quant=quant)
    return path


def diffusion_model_file(quant: str) -> Path:
    """The checkpoint's UNet alone, keys without the "model.diffusion_model." prefix: the file
    UNETLoader reads from models/diffusion_models/."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    source = quantized_checkpoint(quant)
    path = source.with_name(source.stem + "_unet.safetensors")
    if not path.exists():
        prefix = "model.diffusion_model."
        with safe_open(str(source), "pt") as f:
            tensors = {k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
        save_file(tensors, str(path))
    return path


def graph(ckpt: str, prefix: str, pins: bool, unet: str | None = None, odd: bool = False) -> dict:
    """txt2img on `ckpt` (its CLIP and VAE; its UNet too unless `unet` names a diffusion model
    for UNETLoader), with a Pin Model / Pin CLIP / Pin VAE after the loaders when `pins`."""
    api = txt2img_prompt(ckpt_name=ckpt, seed=11, steps=2, prefix=prefix)
    model, clip, vae = ["4", 0], ["4", 1], ["4", 2]
    if unet:
        api["20"] = {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}}
        model = ["20", 0]
    if odd:
        api["21"] = {"class_type": "OddWeightModel", "inputs": {"model": model}}
        model = ["21", 0]
    if pins:
        api["30"], api["31"], api["32"] = pin_node("Model", model), pin_node("CLIP", clip), pin_node("VAE", vae)
        model, clip, vae = ["30", 0], ["31", 0], ["32", 0]
    api["3"]["inputs"]["model"] = model
    api["6"]["inputs"]["clip"] = api["7"]["inputs"]["clip"] = clip
    api["8"]["inputs"]["vae"] = vae
    return api


def image(server, entry):
    files = server.output_files(entry)
    assert len(files) == 1, files
    return np.asarray(Image.open(files[0]).convert("RGB"))


def base_dir(path: Path, formats, viking: bool) -> Path:
    base = prepare_base_dir(path, checkpoint=quantized_checkpoint(formats[0]), ckpt_name=f"{formats[0]}.safetensors",
                            custom_nodes={**({"viking_engine": REPO_ROOT} if viking else {}),
                                          "foreign_model_node": FIXTURE_NODES})
    for quant in formats[1:]:
        (base / "models" / "checkpoints" / f"{quant}.safetensors").symlink_to(quantized_checkpoint(quant))
    (base / "models" / "diffusion_models").mkdir(parents=True, exist_ok=True)
    (base / "models" / "diffusion_models" / "unet_fp8.safetensors").symlink_to(diffusion_model_file(formats[-1]))
    return base


def cases(formats):
    """(name, graph arguments) of every prompt: each format with the Pin nodes, the UNETLoader
    file, a model with a weight nobody knows."""
    yield from ((quant, dict(ckpt=f"{quant}.safetensors")) for quant in formats)
    yield "unet", dict(ckpt=f"{formats[0]}.safetensors", unet="unet_fp8.safetensors")
    yield "odd", dict(ckpt=f"{formats[0]}.safetensors", odd=True)


def post(server, path, body):
    import json
    import urllib.request

    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def repeated_viking_warnings(log: str) -> list:
    lines = [re.sub(r"^\S+ \S+ ", "", line) for line in log.splitlines() if "Viking Engine:" in line and "WARNING" in line]
    return [line for line, count in Counter(lines).items() if count > 1]


def test_downloaded_formats_pin_and_match_comfyui_alone(comfy_version, tmp_path):
    formats = FORMATS[comfy_version]
    images, kinds, file_pages = {}, {}, {}
    with ComfyServer(base_dir(tmp_path / "viking", formats, True), version=comfy_version) as server:
        for name, args in cases(formats):
            before = locked_bytes(server.pid)
            entry = server.run_prompt(graph(prefix=f"v_{name}", pins=True, **args))
            images[name] = image(server, entry)
            status = server.get("/viking/status")
            model = next(o for o in status["owners"] if o["label"].startswith("MODEL"))
            kinds[name] = model["weights"]["bytes_by_kind"]
            file_pages[name] = model["file_page_bytes"]
            if model["file_page_bytes"]:
                assert "locked as the checkpoint file's own pages (nothing copied)" in status["text"], status["text"]
            assert model["pinned_bytes"] >= 0.95 * model["wanted_bytes"] > 0, (name, model)
            assert locked_bytes(server.pid) - before >= 0.9 * status["pinned_bytes"], (name, status["pinned_bytes"])
            left = model["weights"]["left_to_comfyui"]
            if name == "odd":
                assert [l["weights"] for l in left] == [1] and "UnreadableTensor" in left[0]["what"], left
                assert left[0]["bytes"] == 1024 * 256 * 4
                assert any("UnreadableTensor" in note for note in model["notes"]), model["notes"]
            else:
                assert left == [], (name, left)
            assert free_until(server, lambda: server.get("/viking/status")["registrations"] == 0)
        # Engine mode: the same formats with no Viking node in the graph.
        post(server, "/viking/engine", {"enabled": True})
        for quant in formats:
            entry = server.run_prompt(graph(ckpt=f"{quant}.safetensors", prefix=f"e_{quant}", pins=False))
            status = server.get("/viking/status")
            assert all(o["label"].endswith("(engine mode)") for o in status["owners"]), status["owners"]
            kinds[f"engine {quant}"] = Counter()
            for owner in status["owners"]:
                kinds[f"engine {quant}"].update(owner["weights"]["bytes_by_kind"])
            assert all(o["pinned_bytes"] >= 0.95 * o["wanted_bytes"] for o in status["owners"]), status["owners"]
            assert np.array_equal(image(server, entry), images[quant]), quant
            assert free_until(server, lambda: server.get("/viking/status")["registrations"] == 0)
        log = server.log_text()
    print(f"\nbytes by kind, ComfyUI {comfy_version}: {kinds}")
    print(f"locked as the file's own pages (nothing copied): {file_pages}")
    if comfy_version != "0.3.75":  # 0.33 turns every such file into comfy-kitchen QuantizedTensor weights
        for name in formats + ["unet"] + [f"engine {quant}" for quant in formats]:
            assert kinds[name].get("quantized", 0) > 10 << 20, (name, kinds[name])
        # Those weights stay views of the file torch maps copy-on-write: the OS lock holds the
        # file's pages (a lock of the mapping itself would copy every page into new memory).
        for name in formats + ["unet"]:
            assert file_pages[name] >= 0.9 * kinds[name]["quantized"], (name, file_pages[name], kinds[name])
    assert "Traceback" not in log, log[-4000:]
    assert not repeated_viking_warnings(log), repeated_viking_warnings(log)

    with ComfyServer(base_dir(tmp_path / "plain", formats, False), version=comfy_version) as plain:
        for name, args in cases(formats):
            alone = image(plain, plain.run_prompt(graph(prefix=f"p_{name}", pins=False, **args)))
            assert np.array_equal(alone, images[name]), name

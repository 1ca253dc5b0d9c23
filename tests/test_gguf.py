"""GGUF through the real, unmodified ComfyUI-GGUF pack (a test host: tests/hosts.py): its
UnetLoaderGGUF reads a synthetic SD1.5 UNet (Q8_0 linears, F16 convolutions) through a read-only
memory map of the file. With Viking's Pin nodes and with engine mode the prompt succeeds, the
GGUF bytes are counted as such and locked in RAM on the CPU (the OS lock takes file pages;
CUDA never registers a read-only mapping), and the image is bit-identical to ComfyUI alone."""
import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from comfy_server import CACHE_DIR, REPO_ROOT, ComfyServer, cached_checkpoint, pin_node, prepare_base_dir, txt2img_prompt
from comfy_free import free_until
from hosts import GGUF_PACK
from memory_probe import locked_bytes
from test_real_formats import post

pytestmark = pytest.mark.host("gguf")
GGUF_NAME = "synthetic_sd15_unet_q8.gguf"


def gguf_file() -> Path:
    import synthetic_checkpoint

    src = hashlib.sha256(Path(synthetic_checkpoint.__file__).read_bytes()).hexdigest()[:10]
    path = CACHE_DIR / f"synthetic_sd15_unet_q8_{src}.gguf"
    if not path.exists():
        synthetic_checkpoint.make_gguf(str(path), seed=4)
    return path


def graph(prefix: str, pins: bool) -> dict:
    api = txt2img_prompt(seed=13, steps=2, prefix=prefix)
    api["20"] = {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": GGUF_NAME}}
    model = ["20", 0]
    if pins:
        api["30"] = pin_node("Model", model)
        model = ["30", 0]
    api["3"]["inputs"]["model"] = model
    return api


def base_dir(path: Path, viking: bool) -> Path:
    base = prepare_base_dir(path, checkpoint=cached_checkpoint(vae="taesd"),
                            custom_nodes={"ComfyUI-GGUF": GGUF_PACK, **({"viking_engine": REPO_ROOT} if viking else {})})
    (base / "models" / "diffusion_models").mkdir(parents=True, exist_ok=True)
    (base / "models" / "diffusion_models" / GGUF_NAME).symlink_to(gguf_file())
    return base


def image(server, entry):
    return np.asarray(Image.open(server.output_files(entry)[0]).convert("RGB"))


def test_gguf_unet_pins_through_the_real_pack(comfy_version, tmp_path):
    with ComfyServer(base_dir(tmp_path / "viking", True), version=comfy_version) as server:
        before = locked_bytes(server.pid)
        entry = server.run_prompt(graph("viking", pins=True))
        pinned = image(server, entry)
        status = server.get("/viking/status")
        model = next(o for o in status["owners"] if o["label"].startswith("MODEL"))
        kinds = model["weights"]["bytes_by_kind"]
        print(f"\nComfyUI {comfy_version} + ComfyUI-GGUF: bytes by kind {kinds}; pinned {model['pinned_bytes']} "
              f"of {model['wanted_bytes']}; skipped {model['skipped']}")
        assert kinds.get("gguf", 0) > 12 << 20, kinds  # the Q8_0 linears, 14.3 MB (the pack loads the rest as plain tensors)
        assert model["pinned_bytes"] >= 0.95 * model["wanted_bytes"] > 0, model
        assert model["weights"]["left_to_comfyui"] == []
        assert locked_bytes(server.pid) - before >= 0.9 * model["pinned_bytes"]
        assert free_until(server, lambda: server.get("/viking/status")["registrations"] == 0)
        post(server, "/viking/engine", {"enabled": True})
        engine = image(server, server.run_prompt(graph("engine", pins=False)))
        owners = server.get("/viking/status")["owners"]
        assert sum(o["weights"]["bytes_by_kind"].get("gguf", 0) for o in owners) > 12 << 20, owners
        assert all(o["pinned_bytes"] >= 0.95 * o["wanted_bytes"] for o in owners), owners
        assert "Traceback" not in server.log_text()
    with ComfyServer(base_dir(tmp_path / "plain", False), version=comfy_version) as plain:
        alone = image(plain, plain.run_prompt(graph("plain", pins=False)))
    assert np.array_equal(pinned, alone) and np.array_equal(engine, alone)

"""Zero-copy token embeddings (issue 60): mapped views of Viking's CUDA registrations
(viking_native.mapped_view) and Pin CLIP's `zero_copy_embeddings` option.

- On a CUDA GPU (skipped elsewhere, with the reason): a torch tensor aliasing pinned host memory,
  whose gathers are bit-identical to a copy's, that holds its registration; a real ComfyUI
  server whose text encoder reads its table in place, images bit-identical to the option off,
  nothing left mapped after /free.
- Anywhere: a pin of the OS lock has no device address (a clear error), and a real ComfyUI
  server with --cpu maps nothing and says why in the node's text and the status.
"""

import json

import numpy as np
import pytest

vn = pytest.importorskip("viking_native")
torch = pytest.importorskip("torch")

from comfy_server import (ComfyServer, cached_checkpoint, pin_node, prepare_base_dir,  # noqa: E402
                          txt2img_prompt, REPO_ROOT)

OWNER = 606060


def _cuda() -> bool:
    return torch.cuda.is_available() and vn.cuda_device_count() > 0


needs_gpu = pytest.mark.skipif(not _cuda(), reason="no CUDA GPU on this machine: mapped views run on the GPU machine "
                                                   "(scripts/gpu_check.sh part zerocopy)")


def _pin(tensor, backend):
    storage = tensor.untyped_storage()
    return json.loads(vn.reconcile(OWNER, [(storage.data_ptr(), storage.nbytes(), storage)], backend=backend, label="zero-copy test"))


def _owner_status():
    return next(o for o in json.loads(vn.status_json())["owners"] if o["owner"] == OWNER)


def test_an_os_lock_pin_has_no_device_address():
    table = torch.randn(1024, 256)
    report = _pin(table, "os-lock")
    try:
        assert report["pinned_bytes"] == table.untyped_storage().nbytes(), report
        with pytest.raises(vn.BackendUnavailableError, match="os-lock"):
            vn.mapped_view(table.data_ptr(), 4096)
        with pytest.raises(ValueError, match="no pin of Viking's"):
            vn.mapped_view(torch.zeros(1024).data_ptr(), 1024)
        assert _owner_status()["mapped_view_bytes"] == 0
    finally:
        assert vn.release(OWNER) == report["pinned_bytes"]


@needs_gpu
def test_a_view_aliases_pinned_memory_gathers_like_a_copy_and_holds_its_pin():
    rows, width = 32768, 1024
    table = torch.randn(rows, width, dtype=torch.float32).to(torch.bfloat16)  # 64 MiB, random bits in every row
    report = _pin(table, "cuda")
    assert report["backend"] == "cuda" and report["pinned_bytes"] >= table.nbytes, report
    allocated = torch.cuda.memory_allocated()
    view = vn.mapped_view(table.data_ptr(), table.nbytes)
    assert view.nbytes == table.nbytes and view.device_addr != 0
    mapped = torch.as_tensor(view, device="cuda").view(torch.bfloat16).view(rows, width)
    assert mapped.is_cuda and mapped.data_ptr() == view.device_addr
    assert torch.cuda.memory_allocated() == allocated, "the view took device memory"
    ids = torch.randint(0, rows, (4096,), generator=torch.Generator().manual_seed(1))
    copy = table.cuda()
    gathered = torch.nn.functional.embedding(ids.cuda(), mapped)
    assert torch.equal(gathered.view(torch.int16), torch.nn.functional.embedding(ids.cuda(), copy).view(torch.int16))
    # It is the very memory: a row written on the CPU is read by the GPU through the view.
    table[7].fill_(3.0)
    torch.cuda.synchronize()
    assert torch.equal(mapped[7].cpu(), table[7])
    del copy, gathered

    # The view holds the registration: a release leaves it pinned and counted until the tensor goes.
    del view
    assert vn.release(OWNER) == 0
    held = json.loads(vn.status_json())
    assert held["pinned_bytes"] >= table.nbytes
    assert sum(o["mapped_view_bytes"] for o in held["owners"]) >= table.nbytes
    assert torch.equal(mapped[7].cpu(), table[7])  # still readable: still registered
    del mapped
    torch.cuda.synchronize()
    assert vn.release(OWNER) >= table.nbytes  # swept: its owner was forgotten, its last view is gone
    assert sum(o["mapped_view_bytes"] for o in json.loads(vn.status_json())["owners"]) == 0


def _clip_pin_graph(zero_copy: bool, prefix: str, backend: str = "auto") -> dict:
    api = txt2img_prompt(prefix=prefix, steps=2, size=64)
    api["20"] = pin_node("CLIP", ["4", 1], backend=backend, zero_copy_embeddings=zero_copy)
    for node in ("6", "7"):
        api[node]["inputs"]["clip"] = ["20", 0]
    return api


def _node_text(entry, node="20"):
    return "\n".join(entry["outputs"].get(node, {}).get("text", []))


def _pixels(server, entry):
    from PIL import Image

    files = server.output_files(entry)
    assert len(files) == 1, files
    return np.asarray(Image.open(files[0]).convert("RGB"))


def _clip_owner(status):
    return next(o for o in status["owners"] if o["label"].startswith("CLIP"))


def test_cpu_server_maps_nothing_and_says_why(comfy_version, tmp_path):
    base = prepare_base_dir(tmp_path / "base", checkpoint=cached_checkpoint(), custom_nodes={"viking_engine": REPO_ROOT})
    with ComfyServer(base, version=comfy_version) as server:  # --cpu
        entry = server.run_prompt(_clip_pin_graph(True, "zc_cpu"))
        text = _node_text(entry)
        assert "zero-copy embeddings: off, this model runs on the CPU (--cpu): nothing is mapped" in text, text
        status = server.get("/viking/status")
        clip = _clip_owner(status)
        assert clip["zero_copy"] == {"mapped_bytes": 0, "tables": 0, "notes": [
            "zero-copy embeddings: off, this model runs on the CPU (--cpu): nothing is mapped"]}, clip["zero_copy"]
        assert clip["mapped_view_bytes"] == 0 and clip["pinned_bytes"] > 0, clip


@needs_gpu
def test_gpu_server_reads_the_table_in_place_bit_identical_and_frees_it(comfy_version, tmp_path):
    """ComfyUI on the GPU (0.3.75; 0.33 in static mode): Pin CLIP with zero_copy_embeddings maps
    the CLIP-L token table (49408 x 768) and the images equal those with the option off; after
    /free and an unpin nothing is mapped or pinned."""
    base = prepare_base_dir(tmp_path / "base", checkpoint=cached_checkpoint(), custom_nodes={"viking_engine": REPO_ROOT})
    (base / "frontend").mkdir(exist_ok=True)
    args = ["--front-end-root", str(base / "frontend"), "--disable-metadata"]
    if comfy_version != "0.3.75":
        args.append("--disable-dynamic-vram")
    with ComfyServer(base, args, version=comfy_version, cpu=False) as server:
        plain = server.run_prompt(_clip_pin_graph(False, "zc_off"))
        assert "zero-copy" not in _node_text(plain)
        server.free()
        mapped = server.run_prompt(_clip_pin_graph(True, "zc_on"))
        text = _node_text(mapped)
        assert "table(s)" in text and "read in place from pinned RAM" in text, text
        status = server.get("/viking/status")
        clip = _clip_owner(status)
        table_bytes = 49408 * 768 * 2  # fp16 in the synthetic checkpoint
        assert clip["zero_copy"]["mapped_bytes"] >= table_bytes, clip["zero_copy"]
        assert clip["mapped_view_bytes"] >= table_bytes, clip
        assert np.array_equal(_pixels(server, plain), _pixels(server, mapped))
        # Unpin puts the table back as a parameter before its pin goes; /free unloads the rest.
        server.run_prompt({"1": {"class_type": "VikingUnpin", "inputs": {"everything": True}}})
        server.free()
        after = server.get("/viking/status")
        assert after["pinned_bytes"] == 0 and sum(o["mapped_view_bytes"] for o in after["owners"]) == 0, after["owners"]
        log = server.log_text()
        assert "CUDA error" not in log and "Traceback" not in log, server.log_tail(60)


def test_fallbacks_keep_comfyuis_path_with_their_reasons(comfy_env):
    """--cpu, a patched table and a pin without a device address, on each ComfyUI version's own
    classes (tests/zero_copy_check.py)."""
    from conftest import run_checks

    run_checks(comfy_env, "zero_copy_check.py", expected=9)

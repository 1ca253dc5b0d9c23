"""A real ComfyUI server as a container without CAP_IPC_LOCK runs it (Docker's default) or a
normal user: RLIMIT_MEMLOCK at 8 MiB (`prlimit`, `setpriv` drop the capability for the server
process alone). The Pin nodes pin up to the limit and name it, with what to change; the status
counts only what is locked; no pin fails, no warning repeats; the image is bit-identical to
ComfyUI alone."""
import shutil
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from comfy_server import REPO_ROOT, ComfyServer, cached_checkpoint, comfy_install, prepare_base_dir
from memory_probe import locked_bytes
from test_real_formats import graph

LIMIT = 8 << 20


def limited_python(version: str, folder) -> str:
    """A stand-in for the install's Python that runs it without CAP_IPC_LOCK, with LIMIT."""
    wrapper = folder / "python-memlock"
    wrapper.write_text("#!/bin/sh\nexec prlimit --memlock=%d:%d setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock %s \"$@\"\n"
                       % (LIMIT, LIMIT, comfy_install(version).python))
    wrapper.chmod(0o755)
    return str(wrapper)


def test_pin_nodes_under_a_small_lock_limit(comfy_version, tmp_path):
    if not (shutil.which("setpriv") and shutil.which("prlimit")):
        pytest.skip("needs setpriv and prlimit (util-linux) to drop CAP_IPC_LOCK and set the limit")
    checkpoint = cached_checkpoint(vae="taesd")
    api = graph(ckpt="synthetic_sd15.safetensors", prefix="limited", pins=True)
    base = prepare_base_dir(tmp_path / "limited", checkpoint=checkpoint, custom_nodes={"viking_engine": REPO_ROOT})
    with ComfyServer(base, version=comfy_version, python=limited_python(comfy_version, tmp_path)) as server:
        entry = server.run_prompt(api)
        texts = "\n".join(out["text"][0] for out in entry["outputs"].values() if "text" in out)
        limited = image(server, entry)
        status = server.get("/viking/status")
        locked = locked_bytes(server.pid)
        server.run_prompt(graph(ckpt="synthetic_sd15.safetensors", prefix="again", pins=True) | {"3": {
            **api["3"], "inputs": {**api["3"]["inputs"], "seed": 12}}})
        log = server.log_text()
    print(f"\nComfyUI {comfy_version}, ulimit -l 8 MiB: pinned {status['pinned_bytes']} B, VmLck {locked} B; "
          f"node text: {texts.splitlines()[:2]}")
    assert status["os_lock_limit_bytes"] == LIMIT, status["os_lock_limit_bytes"]
    assert 0 < status["pinned_bytes"] <= LIMIT and locked >= status["pinned_bytes"] and locked <= LIMIT
    assert "ulimit -l" in texts and "CAP_IPC_LOCK" in texts and "limited by the locked-memory limit" in texts, texts
    owners = status["owners"]
    assert all(o["pinned_bytes"] + sum(s["bytes"] for s in o["skipped"]) >= o["wanted_bytes"] for o in owners), owners
    assert any(s["reason"] == "lock_limit" for o in owners for s in o["skipped"]), owners
    assert status["counters"]["failures"] == 0, status["counters"]
    # The status's first line names the limit and what to change.
    assert "ulimit -l" in status["text"].splitlines()[0] and "--ulimit memlock=-1" in status["text"].splitlines()[0], status["text"]
    warnings = Counter(line.split("Viking Engine:", 1)[1] for line in log.splitlines() if "Viking Engine:" in line and "WARNING" in line)
    assert all(n == 1 for n in warnings.values()), warnings
    plain = prepare_base_dir(tmp_path / "plain", checkpoint=checkpoint)
    with ComfyServer(plain, version=comfy_version) as alone:
        assert np.array_equal(image(alone, alone.run_prompt(graph(ckpt="synthetic_sd15.safetensors", prefix="p", pins=False))), limited)


def image(server, entry):
    return np.asarray(Image.open(server.output_files(entry)[0]).convert("RGB"))

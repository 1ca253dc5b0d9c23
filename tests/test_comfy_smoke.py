"""End-to-end smoke tests against a real ComfyUI 0.3.75 server on CPU, with no custom node.

Needs scripts/setup_env.sh to have run (.venv and .comfy/ComfyUI). Run with:
    .venv/bin/python -m pytest tests/test_comfy_smoke.py -s      (-s shows the timing lines)
"""
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off sys.path
from comfy_server import (CKPT_NAME, ComfyServer, api_prompt_from_ui_workflow,
                          cached_checkpoint, prepare_base_dir, txt2img_prompt)

pytestmark = pytest.mark.host("0.3.75")


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB"))


def single_image(server, entry):
    files = server.output_files(entry)
    assert len(files) == 1 and files[0].is_file(), files
    return files[0]


@pytest.fixture(scope="module")
def checkpoint():
    t0 = time.monotonic()
    path = cached_checkpoint()
    print(f"\n[timing] synthetic checkpoint ready in {time.monotonic() - t0:.1f} s "
          f"({path.stat().st_size / 1e6:.0f} MB, {path.name})")
    return path


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    base = prepare_base_dir(tmp_path_factory.mktemp("comfy"), checkpoint=checkpoint)
    with ComfyServer(base) as srv:
        print(f"[timing] server up in {srv.start_seconds:.1f} s (pid {srv.pid}, {srv.url})")
        yield srv


def test_txt2img_writes_image(server):
    t0 = time.monotonic()
    entry = server.run_prompt(txt2img_prompt(prefix="smoke"))
    print(f"[timing] first txt2img prompt (loads the checkpoint) {time.monotonic() - t0:.1f} s")
    img = pixels(single_image(server, entry))
    assert img.shape == (64, 64, 3)
    assert img.std() > 1, "flat image: the decoded pixels carry no signal"
    # NaNs would surface as numpy's cast warning in SaveImage and as a black image.
    assert "invalid value encountered" not in server.log_text()

    t0 = time.monotonic()
    entry = server.run_prompt(txt2img_prompt(prefix="smoke", seed=1))  # model already loaded
    print(f"[timing] second txt2img prompt (new seed, model loaded) {time.monotonic() - t0:.1f} s")
    assert server.cached_nodes(entry) >= {"4", "6", "7", "5"}  # only KSampler onwards reran


def test_ui_workflow_conversion(server):
    """The SD1.5 template ComfyUI ships (UI format) converts to the same graph we build by hand."""
    spec = importlib.util.find_spec("comfyui_workflow_templates_media_other")
    if spec is None:
        pytest.skip("workflow templates package not installed")
    ui = json.loads((Path(spec.origin).parent / "templates" / "default.json").read_text())
    api = api_prompt_from_ui_workflow(ui, server.object_info())

    ks = api["3"]["inputs"]
    assert ks["seed"] == 685468484323813 and ks["steps"] == 20 and ks["denoise"] == 1  # skipped 'randomize'
    assert ks["model"] == ["4", 0] and ks["latent_image"] == ["5", 0]
    assert sorted(n["class_type"] for n in api.values()) == sorted(
        n["class_type"] for n in txt2img_prompt().values())  # the MarkdownNotes are gone

    ks.update(steps=1, seed=0)
    api["4"]["inputs"]["ckpt_name"] = CKPT_NAME
    api["5"]["inputs"].update(width=64, height=64)
    entry = server.run_prompt(api)
    assert pixels(single_image(server, entry)).shape == (64, 64, 3)


def test_same_seed_same_pixels(checkpoint, tmp_path):
    """Same prompt and seed: bit-identical pixels, recomputed in one server and in a fresh one."""
    with ComfyServer(prepare_base_dir(tmp_path / "a", checkpoint=checkpoint)) as srv:
        first = single_image(srv, srv.run_prompt(txt2img_prompt(seed=42, prefix="a1")))
        srv.free()  # otherwise ComfyUI serves the second run from its cache
        t0 = time.monotonic()
        entry = srv.run_prompt(txt2img_prompt(seed=42, prefix="a2"))
        print(f"\n[timing] txt2img after /free (reloads the checkpoint) {time.monotonic() - t0:.1f} s")
        assert "3" not in srv.cached_nodes(entry), "KSampler was not recomputed"
        again = single_image(srv, entry)
        other = single_image(srv, srv.run_prompt(txt2img_prompt(seed=43, prefix="a3")))
    with ComfyServer(prepare_base_dir(tmp_path / "b", checkpoint=checkpoint)) as srv:
        fresh = single_image(srv, srv.run_prompt(txt2img_prompt(seed=42, prefix="b1")))

    assert np.array_equal(pixels(first), pixels(again)), "same server, same seed: pixels differ"
    assert np.array_equal(pixels(first), pixels(fresh)), "fresh server, same seed: pixels differ"
    assert not np.array_equal(pixels(first), pixels(other)), "the seed does not change the image"

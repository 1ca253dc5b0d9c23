"""Engine mode on a real ComfyUI: no Viking node in the workflow, yet every model ComfyUI loads
is pinned (locked bytes seen in the server process), released when ComfyUI drops it, and the
image is the same as without Viking."""

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from PIL import Image

from comfy_server import REPO_ROOT as REPO, ComfyServer, cached_checkpoint, prepare_base_dir, txt2img_prompt, wait_for
from comfy_free import free_until
from memory_probe import locked_bytes



def image(server, entry):
    return np.asarray(Image.open(server.output_files(entry)[0]).convert("RGB"))


def post(server, path, body, headers=None):
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode() if body is not None else b"not json",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.fixture(scope="module")
def base(comfy_version, tmp_path_factory):
    return prepare_base_dir(tmp_path_factory.mktemp("engine"), checkpoint=cached_checkpoint(), custom_nodes={"viking_engine": REPO})


def test_env_switch_pins_every_loaded_model_and_releases_on_drop(base, comfy_version, tmp_path):
    with ComfyServer(base, version=comfy_version, env={"VIKING_ENGINE_MODE": "1"}) as server:
        assert server.get("/viking/engine") == {"engine_mode": True}
        entry = server.run_prompt(txt2img_prompt(prefix="engine", seed=5, steps=2))
        status = server.get("/viking/status")
        labels = sorted(o["label"] for o in status["owners"])
        assert len(labels) == 3 and all(label.endswith("(engine mode)") for label in labels), labels
        assert all(o["pinned_bytes"] > 0.95 * o["wanted_bytes"] and o["priority"] == -10 for o in status["owners"])
        assert status["pinned_bytes"] > 300e6
        assert locked_bytes(server.pid) >= status["pinned_bytes"]
        pinned_image = image(server, entry)
        # The environment fixes the mode: the UI cannot switch it off.
        assert post(server, "/viking/engine", {"enabled": False})[0] == 409
        assert free_until(server, lambda: server.get("/viking/status")["registrations"] == 0)
        assert locked_bytes(server.pid) < 1 << 20
    plain_base = prepare_base_dir(tmp_path / "plain", checkpoint=cached_checkpoint())
    with ComfyServer(plain_base, version=comfy_version) as plain:
        assert np.array_equal(pinned_image, image(plain, plain.run_prompt(txt2img_prompt(prefix="plain", seed=5, steps=2))))


def test_ui_setting_route_switches_engine_mode(base, comfy_version):
    with ComfyServer(base, version=comfy_version) as server:
        assert server.get("/viking/engine") == {"engine_mode": False}
        server.run_prompt(txt2img_prompt(prefix="off", seed=6))
        assert server.get("/viking/status")["registrations"] == 0  # off: nothing pinned
        # Another site's page may not switch it; bad bodies get a clear 400.
        assert post(server, "/viking/engine", {"enabled": True}, {"Origin": "http://evil.example"})[0] == 403
        assert post(server, "/viking/engine", {"enabled": "yes"})[0] == 400
        assert post(server, "/viking/engine", None)[0] == 400
        assert post(server, "/viking/engine", {"enabled": True}, {"Origin": server.url}) == (200, {"engine_mode": True})
        # On: the models already loaded are pinned at once, and later loads too.
        assert wait_for(lambda: server.get("/viking/status")["pinned_bytes"] > 300e6)
        assert locked_bytes(server.pid) >= server.get("/viking/status")["pinned_bytes"]
        assert post(server, "/viking/engine", {"enabled": False}) == (200, {"engine_mode": False})
        assert server.get("/viking/status")["registrations"] == 0

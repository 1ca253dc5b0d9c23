"""The settings every model shares live once per server (ComfyUI's settings dialog, or a
VIKING_* variable that fixes them), not on each node: the RAM headroom, on a real ComfyUI."""

import json

import pytest

from comfy_server import REPO_ROOT as REPO, ComfyServer, cached_checkpoint, pin_node, prepare_base_dir, txt2img_prompt
from test_engine_mode import post

GIB = 1 << 30


@pytest.fixture
def base(comfy_version, tmp_path):
    return prepare_base_dir(tmp_path, checkpoint=cached_checkpoint(), custom_nodes={"viking_engine": REPO})


def pinned_prompt(prefix: str, **pin_inputs) -> dict:
    prompt = txt2img_prompt(prefix=prefix, seed=3)
    prompt["20"] = pin_node("Model", ["4", 0], **pin_inputs)
    prompt["3"]["inputs"]["model"] = ["20", 0]
    return prompt


def headroom(server) -> tuple[float, str]:
    answer = server.get("/viking/headroom")
    assert server.get("/viking/status")["budget"]["headroom_bytes"] == round(answer["headroom_gib"] * GIB)
    return answer["headroom_gib"], answer["source"]


def test_headroom_from_the_settings_dialog_and_nodes_that_leave_it(base, comfy_version):
    settings = base / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"Viking.HeadroomGiB": 7}))  # saved by the dialog before this start
    with ComfyServer(base, version=comfy_version) as server:
        assert headroom(server) == (7.0, "settings dialog")
        assert post(server, "/viking/headroom", {"headroom_gib": 5}) == (200, {"headroom_gib": 5.0, "source": "settings dialog"})
        # A node left at 0 (its default) leaves the shared value as it is.
        server.run_prompt(pinned_prompt("zero", headroom_gib=0.0))
        assert headroom(server) == (5.0, "settings dialog")
        # A node that asks for one sets it for every model (saved graphs keep working).
        server.run_prompt(pinned_prompt("three", headroom_gib=3.0))
        assert headroom(server) == (3.0, "node #20")
        # 0 from the dialog: back to auto (20% of RAM, 4-16 GiB).
        assert post(server, "/viking/headroom", {"headroom_gib": 0})[0] == 200
        gib, source = headroom(server)
        assert source == "auto" and 2 <= gib <= 16, (gib, source)
        # Bad values get a clear 400 and change nothing.
        for bad in ({"headroom_gib": -1}, {"headroom_gib": "8"}, {"headroom_gib": True}, {"headroom_gib": 1e30}):
            code, answer = post(server, "/viking/headroom", bad)
            assert code == 400 and answer["error"], (bad, code, answer)
        assert headroom(server) == (gib, "auto")
        assert post(server, "/viking/headroom", {"headroom_gib": 1}, {"Origin": "http://evil.example"})[0] == 403


def test_the_environment_fixes_the_headroom(base, comfy_version):
    with ComfyServer(base, version=comfy_version, env={"VIKING_HEADROOM_GIB": "6"}) as server:
        assert headroom(server) == (6.0, "VIKING_HEADROOM_GIB")
        code, answer = post(server, "/viking/headroom", {"headroom_gib": 2})
        assert code == 409 and "VIKING_HEADROOM_GIB" in answer["error"]
        server.run_prompt(pinned_prompt("fixed", headroom_gib=3.0))  # a node cannot move it either
        assert headroom(server) == (6.0, "VIKING_HEADROOM_GIB")

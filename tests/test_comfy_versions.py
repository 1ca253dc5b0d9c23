"""The two ComfyUI installs (comfy_server.COMFY_INSTALLS) and the `comfy_version` fixture: for each
version a real CPU server starts with the Viking node folder in custom_nodes/, the nodes are
listed, and the plain txt2img graph (the smoke test's) and both example workflows run."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_server import (REPO_ROOT, ComfyServer, api_prompt_from_ui_workflow,
                          cached_checkpoint, prepare_base_dir, txt2img_prompt)


@pytest.fixture(scope="module")
def server(comfy_version, tmp_path_factory):
    base = prepare_base_dir(tmp_path_factory.mktemp(f"comfy-{comfy_version}"), checkpoint=cached_checkpoint(),
                            custom_nodes={"viking_engine": REPO_ROOT})
    with ComfyServer(base, version=comfy_version) as srv:
        print(f"\n[timing] ComfyUI {comfy_version} up in {srv.start_seconds:.1f} s")
        yield srv


def test_server_is_that_version_with_the_nodes(server, comfy_version):
    assert server.get("/system_stats")["system"]["comfyui_version"].startswith(comfy_version)
    info = server.get("/object_info/VikingPinModel")["VikingPinModel"]
    assert info["category"] == "memory/Viking Engine", info
    assert "Cannot import" not in server.log_text(), server.log_tail()


@pytest.mark.parametrize("name", ["viking_pin_checkpoint", "viking_lowvram"])
def test_example_workflows_run(server, name):
    """Both example workflows (the templates) load and run on each version, and pin."""
    ui = json.loads((REPO_ROOT / "workflows" / f"{name}.json").read_text())
    entry = server.run_prompt(api_prompt_from_ui_workflow(ui, server.object_info()), timeout=600)
    assert server.output_files(entry)[0].is_file()
    texts = [out["text"][0] for out in entry["outputs"].values() if "text" in out]
    assert any(text.startswith("Viking Engine") for text in texts), texts  # the status node ran
    assert server.get("/viking/status")["pinned_bytes"] > 0


def test_txt2img_and_example_workflow_run(server):
    files = server.output_files(server.run_prompt(txt2img_prompt(prefix="plain")))
    assert len(files) == 1 and files[0].is_file()

    ui = json.loads((REPO_ROOT / "workflows" / "viking_pin_checkpoint.json").read_text())
    entry = server.run_prompt(api_prompt_from_ui_workflow(ui, server.object_info()))
    assert server.output_files(entry)[0].is_file()
    status = server.get("/viking/status")
    assert status["pinned_bytes"] > 0, status["text"]

"""The templates for the models people run (Flux, SDXL, Wan 2.2's two experts), as a user's
ComfyUI loads them: converted from the UI format with the server's own node list and queued, on
each ComfyUI version. The model files are stand-ins of the names the templates expect (empty: no
test can hold those models), so ComfyUI validates the whole graph (every node type, input and
file name) and then fails at the first load, which is all the stand-ins allow."""
import importlib.util
import json
import time

import pytest

from comfy_server import REPO_ROOT, ComfyServer, api_prompt_from_ui_workflow, prepare_base_dir

spec = importlib.util.spec_from_file_location("make_workflows", REPO_ROOT / "scripts" / "make_workflows.py")
generator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(generator)


@pytest.fixture(scope="module")
def server(comfy_version, tmp_path_factory):
    base = prepare_base_dir(tmp_path_factory.mktemp("templates"), custom_nodes={"viking_engine": REPO_ROOT})
    for files in generator.TEMPLATE_FILES.values():
        for folder, names in files.items():
            (base / "models" / folder).mkdir(parents=True, exist_ok=True)
            for name in names:
                (base / "models" / folder / name).touch()
    with ComfyServer(base, version=comfy_version) as srv:
        yield srv


@pytest.mark.parametrize("name", sorted(generator.TEMPLATE_FILES))
def test_real_model_template_validates(server, name):
    ui = generator.WORKFLOWS[name]
    api = api_prompt_from_ui_workflow(ui, server.object_info())  # raises for an unknown node or input
    assert sum(node["class_type"].startswith("VikingPin") for node in api.values()) >= 3
    # ComfyUI queues a graph whose output nodes are valid in part and lists the rest under
    # node_errors (the Pin nodes are output nodes): every node must pass.
    answer = server._request("/prompt", json.dumps({"prompt": api, "client_id": "viking-templates"}).encode())
    assert answer.get("node_errors") == {}, answer.get("node_errors")
    prompt_id = answer["prompt_id"]
    # Validated and queued; it fails at the first load of an empty stand-in file. Wait for that.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        entry = server.get(f"/history/{prompt_id}").get(prompt_id)
        if entry and entry.get("status", {}).get("completed") is not None:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"{name}: the prompt did not end")
    assert "Traceback" not in server.log_text() or "Viking" not in server.log_text().split("Traceback")[-1][:2000]

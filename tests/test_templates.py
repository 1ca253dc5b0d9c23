"""Every template, as a user's ComfyUI loads it: converted from the UI format with the server's own
node list and queued, on each ComfyUI version.

The templates for any checkpoint leave the file to the user; here the synthetic checkpoint is
picked in the user's place and each runs to its image. The templates for the models people run
(Flux, SDXL, Wan 2.2's two experts) expect those models' files: they are stand-ins of those names
(empty: no test can hold those models), so ComfyUI validates the whole graph (every node type,
input and file name) and then fails at the first load, which is all the stand-ins allow.

Each template's thumbnail (<name>.jpg beside it, what the Templates dialog shows) is a drawing
of its graph, made by the generator and served where the frontend asks for it."""
import importlib.util
import json
import time
import urllib.request

import numpy as np
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


ANY_CHECKPOINT = sorted(set(generator.WORKFLOWS) - set(generator.TEMPLATE_FILES))


def test_any_checkpoint_templates_leave_the_checkpoint_to_the_user():
    assert ANY_CHECKPOINT == ["viking_lowvram", "viking_pin_checkpoint", "viking_two_models"]
    for name in ANY_CHECKPOINT:
        ui = generator.WORKFLOWS[name]
        loaders = [node for node in ui["nodes"] if node["type"] == "CheckpointLoaderSimple"]
        assert loaders and all(node["widgets_values"] == [generator.PICK] for node in loaders), name
        note = next(node["widgets_values"][0] for node in ui["nodes"] if node["type"] == "Note")
        assert note.startswith("Pick your own"), note
        # No file of the tests' anywhere in it.
        assert "synthetic" not in json.dumps(ui), name


@pytest.mark.parametrize("name", ANY_CHECKPOINT)
def test_any_checkpoint_template_runs_on_the_users_pick(server, name):
    """The checkpoint picked (the synthetic one), the template runs whole: every output node,
    the image saved. A loader left out would fail validation and ComfyUI would then run only the
    valid output nodes (the Pin nodes) and call it a success: hence every output node is checked."""
    ui = generator.WORKFLOWS[name]
    api = api_prompt_from_ui_workflow(ui, server.object_info())
    loaders = [node for node in api.values() if node["class_type"] == "CheckpointLoaderSimple"]
    assert loaders and all(node["inputs"]["ckpt_name"] == "synthetic_sd15.safetensors" for node in loaders)
    entry = server.run_prompt(api, timeout=1200)   # 512x512 on a busy 2-core machine: minutes
    info = server.object_info()
    output_nodes = {node_id for node_id, node in api.items() if info[node["class_type"]].get("output_node")}
    assert output_nodes <= set(entry["outputs"]), sorted(output_nodes - set(entry["outputs"]))
    assert server.output_files(entry)[0].is_file()
    pins = [out["text"][0] for node_id, out in entry["outputs"].items() if api[node_id]["class_type"].startswith("VikingPin")]
    assert len(pins) >= 3 and all("Pinned" in text for text in pins), pins


@pytest.mark.parametrize("name", sorted(generator.WORKFLOWS))
def test_thumbnail_is_a_drawing_of_the_graph(name):
    from PIL import Image

    ui = generator.WORKFLOWS[name]
    committed = np.asarray(Image.open(generator.thumbnail_path(name)).convert("RGB"), dtype=np.int16)
    drawn = np.asarray(generator.draw_thumbnail(name, ui), dtype=np.int16)
    assert committed.shape == drawn.shape == (generator.THUMB_SIZE, generator.THUMB_SIZE, 3)
    # JPEG rounds; a stale thumbnail (another graph, another caption) differs by far more.
    assert np.abs(committed - drawn).mean() < 2.0, f"workflows/{name}.jpg: run .venv/bin/python scripts/make_workflows.py"
    # Each node is in the picture where it stands in the graph, in its own colours.
    layout = generator.thumbnail_layout(ui)
    for node in ui["nodes"]:
        left, top, right, bottom = generator.node_box(node, layout)
        x, y = int((left + right) / 2), int(bottom - 3)
        body = generator.node_colours(node)[1]
        expected = np.array([int(body[i:i + 2], 16) for i in (1, 3, 5)])
        assert np.abs(committed[y, x] - expected).max() < 24, (name, node["type"], committed[y, x], body)


def test_thumbnails_are_served_where_the_frontend_asks(server):
    for name in generator.WORKFLOWS:
        # The Templates dialog's URL of a custom node's template picture.
        with urllib.request.urlopen(f"{server.url}/api/workflow_templates/viking_engine/{name}.jpg", timeout=30) as answer:
            assert answer.headers["Content-Type"] == "image/jpeg"
            assert answer.read() == generator.thumbnail_path(name).read_bytes()


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


@pytest.mark.parametrize("name", sorted(generator.WORKFLOWS))
def test_no_node_covers_another(name):
    """Nodes laid out apart, title bars included (the frontend draws each at its pos and size)."""
    ui = generator.WORKFLOWS[name]
    boxes = [(node["type"], generator.node_box(node, (1.0, 0.0, 0.0))) for node in ui["nodes"]]
    for i, (kind_a, a) in enumerate(boxes):
        for kind_b, b in boxes[i + 1:]:
            apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
            assert apart, (name, kind_a, a, kind_b, b)

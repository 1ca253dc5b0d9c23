"""Viking Engine's nodes in a real ComfyUI 0.3.75 server (CPU, the OS-lock backend), installed
the way a user installs a node: the folder copied into custom_nodes/, `pip install .` done in
ComfyUI's Python. Locked bytes are read from the server process itself (/proc/PID/status)."""

import importlib.util
import json
import re
import time
import urllib.error
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from comfy_server import (CLIENT_ID, ComfyError, ComfyServer, NodeClock, api_prompt_from_ui_workflow,
                          cached_checkpoint, prepare_base_dir, txt2img_prompt, without_viking)
from comfy_free import free_until
from memory_probe import locked_bytes

REPO = Path(__file__).resolve().parent.parent
NODE_IDS = ["VikingPinModel", "VikingPinCLIP", "VikingPinVAE", "VikingMemoryStatus", "VikingUnpin"]
PIN_IDS = {"VikingPinModel", "VikingPinCLIP", "VikingPinVAE"}
FIXTURE_NODES = Path(__file__).resolve().parent / "fixtures" / "foreign_model_node"



def workflow(name):
    return json.loads((REPO / "workflows" / f"{name}.json").read_text())


def pixels(server, entry):
    files = server.output_files(entry)
    assert len(files) == 1, files
    return np.asarray(Image.open(files[0]).convert("RGB"))


def status(server):
    return server.get("/viking/status")


def without_node(api, node_id):
    return {k: v for k, v in api.items() if k != node_id and not any(x == [node_id, 0] for x in v["inputs"].values())}


def with_prefix(api, prefix):
    for node in api.values():
        if node["class_type"] == "SaveImage":
            node["inputs"]["filename_prefix"] = prefix
    return api


@pytest.fixture(scope="module")
def checkpoint():
    return cached_checkpoint()


@pytest.fixture(scope="module")
def server(comfy_version, checkpoint, tmp_path_factory):
    base = prepare_base_dir(tmp_path_factory.mktemp("viking"), checkpoint=checkpoint,
                            custom_nodes={"viking_engine": REPO, "foreign_model_node": FIXTURE_NODES})
    with ComfyServer(base, version=comfy_version) as srv:
        yield srv


def test_object_info_lists_every_node_with_its_inputs(server):
    for node_id in NODE_IDS:
        info = server.get(f"/object_info/{node_id}")[node_id]
        assert info["category"] == "memory/Viking Engine"
        assert info["display_name"].startswith("Viking")
    pin = server.get("/object_info/VikingPinModel")["VikingPinModel"]["input"]["required"]
    assert list(pin) == ["model", "budget_gib", "headroom_gib", "backend", "priority", "pinned_home", "vram_cap_gib"]
    assert list(server.get("/object_info/VikingPinModel")["VikingPinModel"]["input"]["optional"]) == ["prefetch", "file_residency"]
    assert pin["backend"][1]["options"] == ["auto", "cuda", "os-lock"]
    assert pin["budget_gib"][1]["min"] == 0.0
    info = server.get("/object_info/VikingPinModel")["VikingPinModel"]
    if server.version == "0.33":  # its comfy_api takes aliases and advanced flags; 0.3.75 has neither
        assert {"swap", "pagefile", "offload"} <= set(info["search_aliases"]), info
        assert pin["headroom_gib"][1].get("advanced") is True and not pin["budget_gib"][1].get("advanced"), pin
    assert all(server.get(f"/object_info/{node_id}")[node_id]["output_node"] for node_id in PIN_IDS)
    unpin = server.get("/object_info/VikingUnpin")["VikingUnpin"]["input"]["optional"]
    assert set(unpin) == {"model", "clip", "vae", "everything"}
    # Help pages (the frontend's node docs panel reads WEB_DIRECTORY/docs/<node id>.md): served, and
    # naming every input the node has.
    for node_id in NODE_IDS:
        info = server.get(f"/object_info/{node_id}")[node_id]["input"]
        page = server.get_text(f"/extensions/viking_engine/docs/{node_id}.md")
        assert page.startswith(f"# {server.get(f'/object_info/{node_id}')[node_id]['display_name']}\n"), page[:80]
        for name in [*info.get("required", {}), *info.get("optional", {})]:
            assert f"**{name}**" in page, (node_id, name)
    templates = server.get("/workflow_templates")
    assert sorted(templates["viking_engine"]) == ["viking_flux", "viking_lowvram", "viking_pin_checkpoint", "viking_sdxl",
                                                  "viking_two_models", "viking_wan22_two_experts"]
    assert "Viking Engine" not in server.log_text() or "Cannot import" not in server.log_text()


def test_example_workflow_pins_samples_and_is_bit_identical(server, comfy_version, checkpoint, tmp_path):
    api = with_prefix(api_prompt_from_ui_workflow(workflow("viking_pin_checkpoint"), server.object_info()), "viking")
    before = locked_bytes(server.pid)
    entry = server.run_prompt(api)
    text = "\n".join(out["text"][0] for out in entry["outputs"].values() if "text" in out)
    assert "Pinned" in text and "Viking Engine" in text, text

    state = status(server)
    labels = {o["label"].split()[0]: o for o in state["owners"]}
    assert set(labels) == {"MODEL", "CLIP", "VAE"}, state["owners"]
    for owner in labels.values():
        assert owner["pinned_bytes"] > 0.95 * owner["wanted_bytes"] > 0, owner
        assert owner["by_backend"] == {"os-lock": owner["pinned_bytes"]}
        assert owner["vram_bytes"] is None, owner  # a CPU server: nothing is in VRAM
    assert "in VRAM" not in state["text"], state["text"]
    assert state["pinned_bytes"] > 300e6  # the synthetic SD1.5: ~0.6 GB in RAM once loaded
    # The kernel agrees: the server process holds at least that much locked memory.
    assert locked_bytes(server.pid) - before >= state["pinned_bytes"]
    assert f"{state['pinned_bytes'] / 2**20:.1f} MiB pinned" in state["text"]
    assert state["text"].splitlines()[0].endswith("in RAM is page-locked: safe from swap."), state["text"]

    # Same seed without Viking, in a fresh server with no custom node: the same pixels.
    pinned_image = pixels(server, entry)
    plain_base = prepare_base_dir(tmp_path / "plain", checkpoint=checkpoint)
    with ComfyServer(plain_base, version=comfy_version) as plain:
        plain_image = pixels(plain, plain.run_prompt(with_prefix(without_viking(api), "plain")))
    assert np.array_equal(pinned_image, plain_image)


def test_committed_workflows_are_what_the_generator_writes():
    """workflows/ is written by scripts/make_workflows.py: a node's new input goes into the
    generator, or the next run of it would take the input out of the templates again."""
    spec = importlib.util.spec_from_file_location("make_workflows", REPO / "scripts" / "make_workflows.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert sorted(generator.WORKFLOWS) == sorted(path.stem for path in (REPO / "workflows").glob("*.json"))
    for name, ui in generator.WORKFLOWS.items():
        assert json.loads(json.dumps(ui)) == workflow(name), f"workflows/{name}.json: run python scripts/make_workflows.py"


def test_two_model_template_pins_each_model_within_the_budget_and_is_bit_identical(comfy_version, checkpoint, tmp_path):
    """The two-model template (Wan 2.2's two experts, a base and a refiner: one sampling run, the
    first model's steps then the second's): each model pinned by its own Pin Model, both within
    the one budget, and the same pixels as the graph without Viking. The second checkpoint is a
    synthetic one of another seed, so the two models' weights differ."""
    ui = workflow("viking_two_models")
    loaders = [node["widgets_values"][0] for node in ui["nodes"] if node["type"] == "CheckpointLoaderSimple"]
    assert loaders == ["", ""], loaders   # the user picks both
    names = ["synthetic_sd15.safetensors", "synthetic_sd15_second.safetensors"]
    second = cached_checkpoint(seed=1)

    def base_dir(name, custom_nodes):
        base = prepare_base_dir(tmp_path / name, checkpoint=checkpoint, ckpt_name=names[0], custom_nodes=custom_nodes)
        (base / "models" / "checkpoints" / names[1]).symlink_to(second)
        return base

    with ComfyServer(base_dir("viking", {"viking_engine": REPO}), version=comfy_version) as server:
        api = with_prefix(api_prompt_from_ui_workflow(ui, server.object_info(), picks=names), "viking")
        entry = server.run_prompt(api)
        pin_texts = [entry["outputs"][k]["text"][0] for k, v in api.items() if v["class_type"] == "VikingPinModel"]
        assert len(pin_texts) == 2 and all("Pinned" in text for text in pin_texts), pin_texts
        state = status(server)
        model_owners = [o for o in state["owners"] if o["label"].startswith("MODEL")]
        assert len(model_owners) == 2, state["owners"]
        for owner in model_owners:
            assert owner["pinned_bytes"] > 0.95 * owner["wanted_bytes"] > 0, owner
        assert sum(o["pinned_bytes"] for o in state["owners"]) == state["pinned_bytes"] <= state["budget"]["limit_bytes"]
        assert locked_bytes(server.pid) >= state["pinned_bytes"]
        pinned_image = pixels(server, entry)
    with ComfyServer(base_dir("plain", None), version=comfy_version) as plain:
        plain_image = pixels(plain, plain.run_prompt(with_prefix(without_viking(api), "plain")))
    assert np.array_equal(pinned_image, plain_image)


def test_queueing_twice_pins_nothing_twice(server):
    api = api_prompt_from_ui_workflow(workflow("viking_pin_checkpoint"), server.object_info())
    server.run_prompt(api)
    first = status(server)
    locked = locked_bytes(server.pid)
    # The same prompt again, and once more with a new seed so sampling really runs (and the
    # model's load / cleanup callbacks reconcile again).
    server.run_prompt(api)
    next(v for v in api.values() if v["class_type"] == "KSampler")["inputs"]["seed"] = 7
    server.run_prompt(api)
    second = status(server)
    assert second["counters"]["registrations"] == first["counters"]["registrations"]
    assert second["registrations"] == first["registrations"]
    assert second["pinned_bytes"] == first["pinned_bytes"]
    assert locked_bytes(server.pid) == locked


def test_two_pin_nodes_on_one_model_share_the_pins(server):
    api = api_prompt_from_ui_workflow(workflow("viking_pin_checkpoint"), server.object_info())
    model_pin = next(k for k, v in api.items() if v["class_type"] == "VikingPinModel")
    api["90"] = {"class_type": "VikingPinModel", "inputs": dict(api[model_pin]["inputs"], priority=3)}
    api["91"] = {"class_type": "VikingMemoryStatus", "inputs": {"after": ["90", 0]}}
    server.run_prompt(without_node(api, "90"))
    before = status(server)
    entry = server.run_prompt(api)
    texts = [entry["outputs"][k]["text"][0] for k in (model_pin, "90") if k in entry["outputs"]]
    assert any("already pinned by Viking node" in t for t in texts), texts
    after = status(server)
    # One set of pins for the one model: the second node changed its settings, not its bytes.
    assert after["registrations"] == before["registrations"]
    assert after["pinned_bytes"] == before["pinned_bytes"]
    model = next(o for o in after["owners"] if o["label"].startswith("MODEL"))
    assert model["priority"] == 3


def test_a_node_left_at_headroom_0_keeps_another_nodes_headroom(server):
    """headroom_gib is shared: the Pin Model asks for 3 GiB, the Pin CLIP after it is left at 0
    (auto): the budget keeps 3 GiB (before, the last node run put it back to auto)."""
    api = api_prompt_from_ui_workflow(workflow("viking_pin_checkpoint"), server.object_info())
    model_pin = next(k for k, v in api.items() if v["class_type"] == "VikingPinModel")
    clip_pin = next(k for k, v in api.items() if v["class_type"] == "VikingPinCLIP")
    api[model_pin]["inputs"]["headroom_gib"] = 3.0
    server.run_prompt(api)
    assert status(server)["budget"]["headroom_bytes"] == 3 << 30
    api[clip_pin]["inputs"]["priority"] = 2  # only the Pin CLIP runs again, its headroom_gib at 0
    server.run_prompt(api)
    assert status(server)["budget"]["headroom_bytes"] == 3 << 30


def test_the_node_text_names_the_limit_that_left_weights_unpinned(server):
    api = api_prompt_from_ui_workflow(workflow("viking_pin_checkpoint"), server.object_info())
    model_pin = next(k for k, v in api.items() if v["class_type"] == "VikingPinModel")
    clip_pin = next(k for k, v in api.items() if v["class_type"] == "VikingPinCLIP")
    api[model_pin]["inputs"]["budget_gib"] = 0.05  # 51.2 MiB of the ~98 MiB model
    api[clip_pin]["inputs"]["priority"] = 1  # a changed input: ComfyUI runs the node again
    entry = server.run_prompt(api)
    model_text, clip_text = (entry["outputs"][k]["text"][0] for k in (model_pin, clip_pin))
    assert "limited by this node's budget_gib: 51.2 MiB" in model_text and "over budget" in model_text, model_text
    assert "budget room left" in clip_text and "limited by" not in clip_text, clip_text
    model = next(o for o in status(server)["owners"] if o["label"].startswith("MODEL"))
    assert 40 << 20 < model["pinned_bytes"] <= 0.05 * 2**30 < model["wanted_bytes"], model
    # Back to no limit of its own: the whole model pins again.
    api[model_pin]["inputs"]["budget_gib"], api[clip_pin]["inputs"]["priority"] = 0.0, 0
    server.run_prompt(api)
    model = next(o for o in status(server)["owners"] if o["label"].startswith("MODEL"))
    assert model["pinned_bytes"] > 0.95 * model["wanted_bytes"], model


def test_unpin_and_cache_drop_release_every_locked_byte(server):
    api = api_prompt_from_ui_workflow(workflow("viking_pin_checkpoint"), server.object_info())
    server.run_prompt(api)
    assert status(server)["pinned_bytes"] > 0
    ckpt = next(k for k, v in api.items() if v["class_type"] == "CheckpointLoaderSimple")
    unpin = {ckpt: api[ckpt], "1": {"class_type": "VikingUnpin", "inputs": {"everything": True}}}
    entry = server.run_prompt(unpin)
    assert "Released every Viking pin" in entry["outputs"]["1"]["text"][0]
    assert status(server)["registrations"] == 0
    assert locked_bytes(server.pid) < 1 << 20

    # Pin nodes run again after an unpin (and pin again).
    server.run_prompt(api)
    assert status(server)["pinned_bytes"] > 300e6
    # ComfyUI drops its models and caches: the finalizers release everything.
    assert free_until(server, lambda: status(server)["registrations"] == 0), status(server)["owners"]
    assert locked_bytes(server.pid) < 1 << 20


def refusal(server, api, node_id):
    """What ComfyUI says of node_id's bad input. A Pin node is an output node, so ComfyUI may
    refuse that output (and every output that depends on it) when the prompt is queued, name the
    node and the input in node_errors, and run the prompt's other outputs, as for any output node;
    or it refuses the whole prompt (400); or the node itself refuses the input as it runs."""
    try:  # not post_prompt: it keeps only the prompt id of ComfyUI's answer, not its node_errors
        queued = server._request("/prompt", json.dumps({"prompt": api, "client_id": CLIENT_ID}).encode())
    except urllib.error.HTTPError as error:  # nothing of the prompt was runnable
        return error.read().decode(errors="replace")
    try:
        entry = server.wait_history(queued["prompt_id"])
    except ComfyError as error:
        return str(error)
    assert node_id in queued.get("node_errors", {}), f"ComfyUI ran node {node_id} with a bad input: {queued}"
    assert node_id not in entry.get("outputs", {}), entry["outputs"]
    return json.dumps(queued["node_errors"][node_id])


# Who refuses an unknown choice of a COMBO input: ComfyUI 0.33 checks V3 combos when the
# prompt is queued (value_not_in_list); 0.3.75 queues it and Viking's node refuses it.
UNKNOWN_BACKEND_REFUSED = {
    "0.3.75": "backend 'warp-drive' is not known; choose one of auto, cuda, os-lock",
    "0.33": r"backend: 'warp-drive' not in \['auto', 'cuda', 'os-lock'\]",
}


def two_model_prompt(names, pin: bool):
    """Two checkpoints, a sampler on each, the second refining the first's latent (a base +
    refiner graph, Wan 2.2's two experts), and the latent saved; a Pin Model between each loader
    and its sampler when `pin`."""
    api = {"5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
           "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a longship", "clip": ["1", 1]}}}
    latent = ["5", 0]
    for index, name in enumerate(names):
        loader, pin_node, sampler = (f"{10 * index + n}" for n in (1, 2, 3))
        api[loader] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": name}}
        model = [loader, 0]
        if pin:
            api[pin_node] = {"class_type": "VikingPinModel", "inputs": {
                "model": model, "budget_gib": 0.0, "headroom_gib": 0.0, "backend": "auto", "priority": 0,
                "pinned_home": True, "vram_cap_gib": 0.0}}
            model = [pin_node, 0]
        api[sampler] = {"class_type": "KSampler", "inputs": {
            "model": model, "positive": ["6", 0], "negative": ["6", 0], "latent_image": latent, "seed": index,
            "steps": 1, "cfg": 1.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0 if index == 0 else 0.5}}
        latent = [sampler, 0]
    api["9"] = {"class_type": "SaveLatent", "inputs": {"samples": latent, "filename_prefix": "order"}}
    return api


def test_pinned_models_load_before_the_first_sampler_as_without_viking(server, checkpoint):
    """ComfyUI runs output nodes, and the nodes that feed them, first (its ux_friendly_pick_node).
    A plain node between loader and sampler made it sample the first model before it loaded the
    second (with Viking on an H200 the cold start of two models took 1.13x as long); the Pin
    nodes are output nodes, so ComfyUI's order of work is the one it has without Viking: every
    loader before the first sampler. Node order from ComfyUI's own websocket events."""
    folder = server.base_dir / "models" / "checkpoints"
    names = {run: [f"order_{run}_{i}.safetensors" for i in (0, 1)] for run in ("alone", "viking")}
    for name in names["alone"] + names["viking"]:  # fresh names: a cached loader sends no event
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(Path(checkpoint).resolve())
    clock = NodeClock(server.url)
    orders = {}
    for run, pin in (("alone", False), ("viking", True)):
        clock.take()
        server.run_prompt(two_model_prompt(names[run], pin))
        time.sleep(0.3)  # the prompt's last websocket messages
        orders[run] = [node for _, node in clock.take() if node is not None]
    for run, order in orders.items():
        assert {"1", "11", "3", "13"} <= set(order), (run, order)
        assert max(order.index("1"), order.index("11")) < order.index("3"), (run, order)


def test_node_clock_hears_each_sampler_step(server):
    """The benches' step times (bench/probes/node_times.py) come from ComfyUI's "progress"
    messages: the first step and the last always, in order, after the sampler started (0.33
    leaves out a step less than 100 ms after the last one it sent)."""
    clock = NodeClock(server.url)
    server.run_prompt(txt2img_prompt(seed=4242, steps=3, prefix="steps"))
    time.sleep(0.3)  # the prompt's last websocket messages
    started = next(at for at, node in clock.take() if node == "3")
    steps = [(at, value) for at, node, value in clock.take_steps() if node == "3"]
    values, times = [value for _, value in steps], [at for at, _ in steps]
    assert values[0] == 1 and values[-1] == 3 and values == sorted(set(values)), steps
    assert started < times[0] and times == sorted(times), (started, steps)


def test_bad_input_gets_clear_messages_and_the_queue_keeps_running(server, comfy_version):
    api = api_prompt_from_ui_workflow(workflow("viking_pin_checkpoint"), server.object_info())
    model_pin = next(k for k, v in api.items() if v["class_type"] == "VikingPinModel")
    bad = json.loads(json.dumps(api))
    bad[model_pin]["inputs"]["budget_gib"] = -3
    assert re.search(r"budget_gib", refusal(server, bad, model_pin))
    bad = json.loads(json.dumps(api))
    bad[model_pin]["inputs"]["backend"] = "warp-drive"
    assert re.search(UNKNOWN_BACKEND_REFUSED[comfy_version], refusal(server, bad, model_pin))
    # A MODEL from another node pack that is not a ModelPatcher.
    foreign = {"1": {"class_type": "ForeignModel", "inputs": {}},
               "2": {"class_type": "VikingPinModel", "inputs": {"model": ["1", 0], "budget_gib": 0.0, "headroom_gib": 0.0, "backend": "auto", "priority": 0, "pinned_home": True, "vram_cap_gib": 0.0}},
               "3": {"class_type": "VikingMemoryStatus", "inputs": {"after": ["2", 0]}}}
    with pytest.raises(ComfyError, match="needs a ComfyUI MODEL input backed by a ModelPatcher"):
        server.run_prompt(foreign)
    # No GPU here: asking for CUDA explicitly says so and what to choose instead.
    cuda = json.loads(json.dumps(api))
    cuda[model_pin]["inputs"]["backend"] = "cuda"
    cuda[model_pin]["inputs"]["priority"] = 1
    with pytest.raises(ComfyError, match="Choose backend 'auto' or 'os-lock'"):
        server.run_prompt(cuda)
    # The queue still works.
    assert server.run_prompt(api)["status"]["status_str"] == "success"


def test_v1_fallback_for_older_comfyui(comfy_version, checkpoint, tmp_path):
    """The classic NODE_CLASS_MAPPINGS classes (what an older ComfyUI without comfy_api loads)
    list the same nodes and run the example workflow to the same pins."""
    base = prepare_base_dir(tmp_path / "v1", checkpoint=checkpoint, custom_nodes={"viking_engine": REPO})
    with ComfyServer(base, version=comfy_version, env={"VIKING_FORCE_V1_NODES": "1"}) as server:
        assert "Viking Engine" not in server.log_text() or "Cannot import" not in server.log_text()
        for node_id in NODE_IDS:
            assert server.get(f"/object_info/{node_id}")[node_id]["category"] == "memory/Viking Engine"
        pin = server.get("/object_info/VikingPinModel")["VikingPinModel"]["input"]["required"]
        assert list(pin) == ["model", "budget_gib", "headroom_gib", "backend", "priority", "pinned_home", "vram_cap_gib"]
        assert list(server.get("/object_info/VikingPinModel")["VikingPinModel"]["input"]["optional"]) == ["prefetch", "file_residency"]
        assert all(server.get(f"/object_info/{node_id}")[node_id]["output_node"] for node_id in PIN_IDS)
        entry = server.run_prompt(api_prompt_from_ui_workflow(workflow("viking_pin_checkpoint"), server.object_info()))
        assert any("Pinned" in out["text"][0] for out in entry["outputs"].values() if "text" in out)
        state = status(server)
        assert {o["label"].split()[0] for o in state["owners"]} == {"MODEL", "CLIP", "VAE"}
        assert locked_bytes(server.pid) >= state["pinned_bytes"] > 300e6

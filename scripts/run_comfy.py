"""The main job: a real ComfyUI (0.3.75, CPU unless --gpu) with Viking Engine installed as a
custom node, the example workflow run on a small synthetic checkpoint, and Viking's status
printed. Then the server keeps serving (open the URL; the workflow is under Templates) until
Ctrl-C, or stops at once with --once.

usage: python scripts/run_comfy.py [--once] [--gpu] [--port N]"""

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from comfy_server import ComfyServer, api_prompt_from_ui_workflow, cached_checkpoint, prepare_base_dir  # noqa: E402

once, gpu = "--once" in sys.argv, "--gpu" in sys.argv
port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 8188

print("[viking] preparing the synthetic checkpoint and the ComfyUI base directory", flush=True)
base = prepare_base_dir(REPO / ".comfy" / "demo", checkpoint=cached_checkpoint(), custom_nodes={"viking_engine": REPO})
with ComfyServer(base, cpu=not gpu, port=port) as server:
    print(f"[viking] ComfyUI is up at {server.url} (pid {server.pid}, log {server.log_path})", flush=True)
    ui_workflow = json.loads((REPO / "workflows" / "viking_pin_checkpoint.json").read_text())
    entry = server.run_prompt(api_prompt_from_ui_workflow(ui_workflow, server.object_info()))
    for node_id, output in sorted(entry["outputs"].items()):
        if "text" in output and not output["text"][0].startswith("Viking Engine"):
            print(f"[viking] node {node_id}: {output['text'][0]}")
    print(f"[viking] image: {server.output_files(entry)[0]}")
    print("\n" + server.get("/viking/status")["text"] + "\n", flush=True)
    if not once:
        print(f"[viking] serving {server.url} until Ctrl-C", flush=True)
        try:
            while server.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass

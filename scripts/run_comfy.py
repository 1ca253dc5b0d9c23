"""The main job: a real ComfyUI (0.3.75 unless --comfy 0.33; CPU unless --gpu) with Viking Engine
installed as a custom node, the example workflow run on a small synthetic checkpoint, and
Viking's status printed. Then the server keeps serving (open the URL; the workflow is under
Templates) until Ctrl-C, or stops at once with --once.

usage: python scripts/run_comfy.py [--comfy 0.3.75|0.33] [--once] [--gpu] [--port N] [--base DIR]

Whatever ends this script ends the server it started: Ctrl-C, SIGINT (also when this runs as a
background job, where the shell makes it ignore SIGINT), SIGTERM and SIGHUP each stop the server
before the script exits. The server runs in its own session, so a signal sent to this script
alone would otherwise leave it serving.

--base DIR: ComfyUI's base directory (models, custom_nodes, output); default .comfy/demo
(.comfy/demo-0.33 for 0.33).

--comfy picks the ComfyUI install (tests/comfy_server.py's COMFY_INSTALLS, both made by
scripts/setup_env.sh): 0.3.75 (the default, run by .venv) or 0.33 (run by .comfy/venv-0.33).
Any python can run this script: the server runs under that install's own Python."""

import json
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from comfy_server import (COMFY_INSTALLS, DEFAULT_COMFY, ComfyServer, api_prompt_from_ui_workflow,  # noqa: E402
                          cached_checkpoint, comfy_unavailable, prepare_base_dir)


def option(name, default):
    """The value of `--name VALUE` or `--name=VALUE` on the command line, else `default`."""
    for i, arg in enumerate(sys.argv[1:], 1):
        if arg == name and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


once, gpu = "--once" in sys.argv, "--gpu" in sys.argv
port = int(option("--port", 8188))
version = option("--comfy", DEFAULT_COMFY)
if version not in COMFY_INSTALLS:
    sys.exit(f"[viking] --comfy {version}: no such ComfyUI install; one of {', '.join(COMFY_INSTALLS)}")
if comfy_unavailable(version):
    sys.exit(f"[viking] cannot run ComfyUI {version}: {comfy_unavailable(version)}")


def stop_on_signal(signum, _frame):
    """Turns SIGINT/SIGTERM/SIGHUP into an exception, so the `with` block below stops the server.
    Further signals are ignored from here on: the server's own stop (SIGTERM, then SIGKILL after
    15 s) is already bounded, and a second Ctrl-C must not cut it short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    try:
        print(f"[viking] {signal.Signals(signum).name}: stopping the ComfyUI server", flush=True)
    except OSError:   # the terminal that sent SIGHUP is gone
        pass
    raise SystemExit(128 + signum)


# Set even where SIGINT is ignored: a shell starts a background job with SIGINT ignored, and then
# Python installs no KeyboardInterrupt handler of its own.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
for sig in STOP_SIGNALS:
    signal.signal(sig, stop_on_signal)

print(f"[viking] preparing the synthetic checkpoint and the ComfyUI {version} base directory", flush=True)
demo = Path(option("--base", REPO / ".comfy" / ("demo" if version == DEFAULT_COMFY else f"demo-{version}")))
base = prepare_base_dir(demo, checkpoint=cached_checkpoint(), custom_nodes={"viking_engine": REPO})
with ComfyServer(base, version=version, cpu=not gpu, port=port) as server:
    print(f"[viking] ComfyUI {version} is up at {server.url} (pid {server.pid}, log {server.log_path})", flush=True)
    ui_workflow = json.loads((REPO / "workflows" / "viking_pin_checkpoint.json").read_text())
    entry = server.run_prompt(api_prompt_from_ui_workflow(ui_workflow, server.object_info()))
    for node_id, output in sorted(entry["outputs"].items()):
        if "text" in output and not output["text"][0].startswith("Viking Engine"):
            # A Pin node's text: its model's line, then what it skipped, indented under it.
            first, *rest = output["text"][0].splitlines() or [""]
            print(f"[viking] node {node_id}: {first}" + "".join(f"\n[viking]     {line}" for line in rest))
    print(f"[viking] image: {server.output_files(entry)[0]}")
    print("\n" + server.get("/viking/status")["text"] + "\n", flush=True)
    if not once:
        print(f"[viking] serving {server.url} until Ctrl-C", flush=True)
        while server.proc.poll() is None:
            time.sleep(1)

"""Run a real ComfyUI server (the copies made by scripts/setup_env.sh) for end-to-end tests.

No pytest in here, so scripts and benchmarks can use it too:

    from comfy_server import prepare_base_dir, ComfyServer, txt2img_prompt
    base = prepare_base_dir("/tmp/run1", custom_nodes={"viking_engine": REPO_ROOT})
    with ComfyServer(base) as srv:                  # ComfyUI 0.3.75; version="0.33" for 0.33
        entry = srv.run_prompt(txt2img_prompt())
        print(srv.output_files(entry))

Two ComfyUI installs, each a tree and the Python that runs it (COMFY_INSTALLS):
    "0.3.75"  .comfy/ComfyUI                     run by .venv/bin/python (3.11)    the default
    "0.33"    the hosts folder's ComfyUI-0.33.0  run by .comfy/venv-0.33/bin/python (3.12)
(tests/hosts.py says where the hosts folder is: outside the repository.)
`comfy_unavailable(version)` says why one is not there (None when it is); in-process scripts
(tests/*_check.py, bench/) get the tree and the interpreter from `comfy_install(version)`.

The server only ever listens on 127.0.0.1 and is always stopped when the `with` block ends.
"""
import asyncio
import atexit
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from hosts import COMFY033_TREE, HOW_TO_GET, UNAVAILABLE_FILES

REPO_ROOT = Path(__file__).resolve().parent.parent
COMFY_DIR = REPO_ROOT / ".comfy" / "ComfyUI"                # ComfyUI 0.3.75 (the default)
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
CACHE_DIR = REPO_ROOT / ".comfy" / "cache"
CKPT_NAME = "synthetic_sd15.safetensors"
CLIENT_ID = "viking-tests"  # the client id prompts are posted with: ComfyUI sends it the node events

# What never goes into an installed custom node folder (a user's copy has none of these).
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", ".comfy", "target", "__pycache__", "*.pyc",
                                     ".pytest_cache", "*.egg-info", "dist", "build")


# ---- the ComfyUI installs ------------------------------------------------------------------------
class ComfyInstall:
    """One ComfyUI made by scripts/setup_env.sh: its tree and the Python that runs it."""

    def __init__(self, version, tree, python, setup_step, unavailable_file=None):
        self.version, self.tree, self.python = version, Path(tree), Path(python)
        self.setup_step = setup_step              # the setup_env.sh command that makes it
        self.unavailable_file = unavailable_file  # where setup_env.sh wrote why it could not

    def unavailable(self):
        """Why this install cannot run a server, or None when it can."""
        if self.unavailable_file and self.unavailable_file.exists():
            why = self.unavailable_file.read_text().strip()
            return f"ComfyUI {self.version} was not prepared: {why}"
        if not (self.tree / "main.py").exists():
            return f"no ComfyUI {self.version} tree at {self.tree}: run {self.setup_step}"
        if not self.python.exists():
            return f"no Python for ComfyUI {self.version} at {self.python}: run {self.setup_step}"
        if not any(self.python.parent.parent.glob(".setup-stamp-*")):
            return f"ComfyUI {self.version}'s packages are not (fully) installed in {self.python.parent.parent}: run {self.setup_step}"
        return None

    def __repr__(self):
        return f"ComfyInstall({self.version!r}, tree={str(self.tree)!r}, python={str(self.python)!r})"


DEFAULT_COMFY = "0.3.75"
COMFY_INSTALLS = {
    "0.3.75": ComfyInstall("0.3.75", COMFY_DIR, VENV_PYTHON, "scripts/setup_env.sh"),
    "0.33": ComfyInstall("0.33", COMFY033_TREE, REPO_ROOT / ".comfy" / "venv-0.33" / "bin" / "python",
                         f"scripts/setup_env.sh comfy033 once the tree is there ({HOW_TO_GET})",
                         unavailable_file=UNAVAILABLE_FILES["0.33"]),
}


def comfy_install(version=DEFAULT_COMFY):
    try:
        return COMFY_INSTALLS[version]
    except KeyError:
        raise ValueError(f"unknown ComfyUI version {version!r}: one of {', '.join(COMFY_INSTALLS)}") from None


def comfy_unavailable(version=DEFAULT_COMFY):
    """Why ComfyUI `version` cannot run here (a sentence for a skip), or None when it can."""
    return comfy_install(version).unavailable()


def database_url(base_dir, port) -> str:
    """ComfyUI's database for one server: a file of its own in its base directory, as a user's
    ComfyUI has one (the default, user/comfyui.db inside the tree, is a folder that does not
    exist there; two servers on one file would stop at "database is locked"). Not an in-memory
    one: ComfyUI 0.3.75's init_db leaves its migration connection to the garbage collector, and
    SQLAlchemy keeps an in-memory SQLite connection to the thread that made it, so a collection
    on any other thread (ComfyUI's execution thread collects after prompts) logs three
    tracebacks of SQLAlchemy's pool (tests/test_harness_database.py)."""
    return f"sqlite:///{Path(base_dir).resolve()}/comfyui-{port}.db"


# ---- base directory ------------------------------------------------------------------------------
def cached_checkpoint(seed=0, vae="kl"):
    """Path of the synthetic checkpoint for (seed, vae), written once under .comfy/cache.

    The file name carries a hash of the generator's source, so editing it makes a new file.
    """
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # pytest's importlib mode leaves tests/ off sys.path
        sys.path.insert(0, here)
    import synthetic_checkpoint

    src_hash = hashlib.sha256(Path(synthetic_checkpoint.__file__).read_bytes()).hexdigest()[:10]
    path = CACHE_DIR / f"synthetic_sd15_{vae}_s{seed}_{src_hash}.safetensors"
    if not path.exists():
        synthetic_checkpoint.make_checkpoint(str(path), seed=seed, vae=vae)
    return path


def cached_lora(seed=1):
    """Path of the synthetic LoRA for the synthetic checkpoint, written once under .comfy/cache."""
    cached_checkpoint()  # puts tests/ on sys.path
    import synthetic_checkpoint

    src_hash = hashlib.sha256(Path(synthetic_checkpoint.__file__).read_bytes()).hexdigest()[:10]
    path = CACHE_DIR / f"synthetic_sd15_lora_s{seed}_{src_hash}.safetensors"
    if not path.exists():
        synthetic_checkpoint.make_lora(str(path), seed=seed)
    return path


def prepare_base_dir(base, custom_nodes=None, checkpoint=None, ckpt_name=CKPT_NAME, loras=None):
    """Make `base` a ComfyUI --base-directory and return it as a Path.

    custom_nodes: {folder_name: source_dir}; each source is COPIED to custom_nodes/<folder_name>,
        the way a user drops a node folder in (minus .git, .venv, target, caches).
    checkpoint: a .safetensors file to offer as models/checkpoints/<ckpt_name> (a symlink);
        default: the cached synthetic SD1.5 checkpoint, seed 0.
    loras: {file_name: path} offered in models/loras/ (symlinks).
    """
    base = Path(base)
    for sub in ("models/checkpoints", "models/loras", "custom_nodes", "input", "output"):
        # custom_nodes/ must exist: ComfyUI 0.3.75 crashes at start (prestartup scan) without it.
        (base / sub).mkdir(parents=True, exist_ok=True)
    link = base / "models" / "checkpoints" / ckpt_name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path(checkpoint or cached_checkpoint()).resolve())
    for name, path in (loras or {}).items():
        lora_link = base / "models" / "loras" / name
        if lora_link.is_symlink() or lora_link.exists():
            lora_link.unlink()
        lora_link.symlink_to(Path(path).resolve())
    for name, src in (custom_nodes or {}).items():
        dest = base / "custom_nodes" / name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest, ignore=COPY_IGNORE, symlinks=True)
    return base


# ---- the server ----------------------------------------------------------------------------------
class ComfyError(RuntimeError):
    """ComfyUI refused a prompt, a prompt failed, or the server did not come up."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    """`python main.py --cpu ...` of one ComfyUI install as a context manager.

    version: which of COMFY_INSTALLS ("0.3.75", the default, or "0.33"); comfy_dir / python
    override its tree / interpreter. extra_args: more command-line flags (e.g.
    ["--disable-pinned-memory"]); cpu=False drops --cpu (for a GPU machine). env: extra
    environment variables. The log goes to <base>/comfy-<port>.log.
    """

    def __init__(self, base_dir, extra_args=(), *, version=DEFAULT_COMFY, cpu=True, port=None, env=None,
                 start_timeout=180, comfy_dir=None, python=None):
        self.install = comfy_install(version)
        self.version = version
        comfy_dir = comfy_dir or self.install.tree
        python = python or self.install.python
        self.base_dir = Path(base_dir).resolve()
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.base_dir / f"comfy-{self.port}.log"
        self.cmd = [str(python), "main.py", "--listen", "127.0.0.1", "--port", str(self.port),
                    "--disable-auto-launch", "--base-directory", str(self.base_dir),
                    "--database-url", database_url(self.base_dir, self.port)] + (["--cpu"] if cpu else []) + list(extra_args)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.start_timeout = start_timeout
        self.comfy_dir = Path(comfy_dir)
        self.proc = None
        self.start_seconds = None
        self._object_info = None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    # -- lifecycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        if not (self.comfy_dir / "main.py").exists():
            raise ComfyError(f"no ComfyUI {self.version} at {self.comfy_dir}: run {self.install.setup_step}")
        if not Path(self.cmd[0]).exists():
            raise ComfyError(f"no Python for ComfyUI {self.version} at {self.cmd[0]}: run {self.install.setup_step}")
        # Both versions need custom_nodes/ in the base directory: 0.3.75 crashes in its prestartup
        # scan without it, 0.33 exits.
        (self.base_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self._log = open(self.log_path, "wb")
        # Own session: stop() can signal the server without touching the test process.
        self.proc = subprocess.Popen(self.cmd, cwd=self.comfy_dir, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        atexit.register(self.stop)  # last resort if the with-block is never left normally
        try:
            while True:
                if self.proc.poll() is not None:
                    raise ComfyError(f"ComfyUI exited with {self.proc.returncode} at start\n{self.log_tail()}")
                if time.monotonic() - t0 > self.start_timeout:
                    raise ComfyError(f"ComfyUI did not answer within {self.start_timeout} s\n{self.log_tail()}")
                try:
                    self._object_info = self.get("/object_info")  # answers once all nodes are loaded
                    break
                except (urllib.error.URLError, ConnectionError, OSError):
                    time.sleep(0.25)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0

    def stop(self, timeout=15):
        """Terminate the server (SIGTERM, then SIGKILL). Safe to call twice."""
        atexit.unregister(self.stop)
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # its own process group (start_new_session)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None

    # -- log
    def log_text(self):
        """The server's log so far, without the colour codes 0.33 puts around its level tags."""
        return _ANSI.sub("", self.log_path.read_text(errors="replace")) if self.log_path.exists() else ""

    def log_tail(self, lines=40):
        return "\n".join(self.log_text().splitlines()[-lines:])

    # -- HTTP (stdlib only)
    def _request(self, path, data=None, timeout=30):
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"} if data else {})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body else None

    def get(self, path, timeout=30):
        """GET `path` (e.g. "/object_info/KSampler", "/system_stats") and decode the JSON."""
        return self._request(path, timeout=timeout)

    def get_text(self, path, timeout=30):
        """GET `path` (a static file, e.g. an extension's help page) as text."""
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read().decode("utf-8")

    def object_info(self):
        if self._object_info is None:
            self._object_info = self.get("/object_info")
        return self._object_info

    def post_prompt(self, api_graph, client_id=CLIENT_ID):
        """Queue an API-format graph; returns its prompt_id. Raises ComfyError with ComfyUI's
        validation errors (per node) when it refuses the graph."""
        data = json.dumps({"prompt": api_graph, "client_id": client_id}).encode()
        try:
            return self._request("/prompt", data)["prompt_id"]
        except urllib.error.HTTPError as e:
            raise ComfyError(f"prompt refused ({e.code}): {e.read().decode(errors='replace')}") from None

    def wait_history(self, prompt_id, timeout=300):
        """Wait for the prompt to finish and return its /history entry (with "outputs").
        Raises ComfyError with the failing node's error text if it failed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entry = self.get(f"/history/{prompt_id}").get(prompt_id)
            if entry and entry.get("status", {}).get("completed") is not None:
                status = entry["status"]
                if status.get("status_str") == "error":
                    raise ComfyError(f"prompt {prompt_id} failed:\n{_error_text(status)}")
                return entry
            if self.proc.poll() is not None:
                raise ComfyError(f"ComfyUI died (exit {self.proc.returncode})\n{self.log_tail()}")
            time.sleep(0.1)
        raise ComfyError(f"prompt {prompt_id} not done after {timeout} s\n{self.log_tail()}")

    def run_prompt(self, api_graph, timeout=300):
        return self.wait_history(self.post_prompt(api_graph), timeout)

    def free(self, unload_models=True, settle=0.5, free_memory=True, idle=1.5):
        """POST /free: drop ComfyUI's node-output cache (free_memory) and/or unload the loaded
        models to RAM (unload_models), so the next identical prompt is computed again. ComfyUI
        applies it when its worker wakes (at once while it waits for work), but a /free that
        arrives while the worker runs its garbage collection after a prompt (up to a second or
        more on a slow machine) wakes nobody and waits for the next prompt (main.py's
        prompt_worker reads the flags before it collects): so `idle` seconds before, for the
        collection to end, and `settle` seconds of grace before the next post_prompt."""
        time.sleep(idle)
        self._request("/free", json.dumps({"free_memory": free_memory, "unload_models": unload_models}).encode())
        time.sleep(settle)

    @staticmethod
    def cached_nodes(entry):
        """Ids of the nodes whose results came from ComfyUI's cache in that run."""
        return {n for kind, msg in entry["status"].get("messages", []) if kind == "execution_cached"
                for n in msg.get("nodes", [])}

    def output_files(self, entry):
        """Absolute paths of the images an entry's nodes saved (SaveImage: type "output")."""
        files = []
        for node_out in entry.get("outputs", {}).values():
            for img in node_out.get("images", []):
                root = {"output": "output", "temp": "temp", "input": "input"}[img.get("type", "output")]
                files.append(self.base_dir / root / img.get("subfolder", "") / img["filename"])
        return files


class NodeClock:
    """Listens on a server's websocket and keeps (monotonic seconds, node id) for each message
    that marks a node's start ("executing"; node None once the prompt is done) or the prompt's
    end, for the prompts posted with CLIENT_ID (ComfyUI sends a client only its own prompts'
    events), and (monotonic seconds, node id, value) for each "progress" message (a sampler's
    step done). `take()` / `take_steps()` hand over what came since the last take."""

    def __init__(self, url: str):
        self.events: list[tuple[float, str | None]] = []
        self.steps: list[tuple[float, str | None, int]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        threading.Thread(target=lambda: asyncio.run(self._listen(url)), daemon=True).start()
        if not self._ready.wait(30):
            raise ComfyError(f"no websocket at {url}/ws")

    async def _listen(self, url: str):
        import aiohttp  # ComfyUI's own dependency: every Python that runs a server here has it

        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{url}/ws?clientId={CLIENT_ID}", max_msg_size=0) as ws:
                self._ready.set()
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.TEXT:
                        continue  # previews come as binary frames
                    body = json.loads(message.data)
                    kind, data = body.get("type"), body.get("data") or {}
                    with self._lock:
                        if kind in ("executing", "execution_success"):
                            self.events.append((time.monotonic(), data.get("node")))
                        elif kind == "progress":
                            self.steps.append((time.monotonic(), data.get("node"), data.get("value")))

    def take(self) -> list[tuple[float, str | None]]:
        with self._lock:
            events, self.events = self.events, []
        return events

    def take_steps(self) -> list[tuple[float, str | None, int]]:
        with self._lock:
            steps, self.steps = self.steps, []
        return steps


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _error_text(status):
    lines = []
    for kind, msg in status.get("messages", []):
        if kind == "execution_error":
            lines.append(f"node {msg.get('node_id')} ({msg.get('node_type')}): "
                         f"{msg.get('exception_type')}: {msg.get('exception_message')}")
            lines += [l.rstrip() for l in msg.get("traceback", [])]
        elif kind == "execution_interrupted":
            lines.append("interrupted")
    return "\n".join(lines) or json.dumps(status)


# ---- graphs --------------------------------------------------------------------------------------
def txt2img_prompt(ckpt_name=CKPT_NAME, seed=0, steps=1, size=64, prefix="txt2img",
                   positive="a photo of a viking ship", negative="blurry"):
    """The plain SD1.5 txt2img API graph: checkpoint -> 2x text encode -> empty latent ->
    KSampler -> VAEDecode -> SaveImage."""
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt_name}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": positive, "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": negative, "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0],
            "seed": seed, "steps": steps, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal",
            "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": prefix}},
    }


PIN_DEFAULTS = {"budget_gib": 0.0, "headroom_gib": 0.0, "backend": "auto", "priority": 0, "pinned_home": True}


def pin_node(kind: str, source: list, **overrides) -> dict:
    """An API-graph Viking Pin node (kind "Model", "CLIP" or "VAE") on `source` ([node id,
    output]) with the nodes' default inputs, `overrides` on top."""
    extra = {"vram_cap_gib": 0.0} if kind == "Model" else {}
    return {"class_type": f"VikingPin{kind}", "inputs": {kind.lower(): source, **PIN_DEFAULTS, **extra, **overrides}}


# UI-only node types: they never reach the server.
_FRONTEND_ONLY = {"Note", "MarkdownNote", "PrimitiveNode", "Reroute"}
_WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
_MUTED, _BYPASSED = 2, 4


def api_prompt_from_ui_workflow(ui, object_info, picks=None):
    """Convert a UI-format workflow (what ComfyUI's frontend saves: "nodes", "links",
    "widgets_values") into the API format POST /prompt takes.

    A template for any checkpoint leaves its loaders' file lists empty ("") for the user to pick
    one (scripts/make_workflows.py, PICK). The harness picks in the user's place: `picks`, the
    file names for those empty choices in the order of the nodes; where it runs out (or is not
    given), the synthetic checkpoint CKPT_NAME that prepare_base_dir offers.

    Widget values are positional in the UI format; their names come from object_info's input
    order, skipping the extra "control_after_generate" value (fixed/randomize/...) that the
    frontend stores after seed-like inputs. Handles Reroute, PrimitiveNode, notes, muted and
    bypassed nodes. Not handled: subgraphs / group nodes (raises ValueError).
    """
    if ui.get("definitions", {}).get("subgraphs"):
        raise ValueError("workflows with subgraphs are not supported")
    nodes = {n["id"]: n for n in ui["nodes"]}
    links = {l[0]: l for l in ui["links"]}  # [id, from_node, from_slot, to_node, to_slot, type]

    def source(link_id):
        """Follow a link back through reroutes and bypassed nodes to a real output, or None."""
        while link_id is not None:
            _, src, slot, _, _, typ = links[link_id]
            n = nodes[src]
            if n["type"] == "Reroute":
                link_id = n["inputs"][0].get("link")
            elif n.get("mode") == _BYPASSED:  # bypass: pass through the first input of that type
                link_id = next((i.get("link") for i in n.get("inputs", []) if i["type"] == typ), None)
            elif n.get("mode") == _MUTED or n["type"] in _FRONTEND_ONLY:
                return None
            else:
                return [str(src), slot]
        return None

    picks = list(picks or [])
    prompt = {}
    for node in ui["nodes"]:
        if node["type"] in _FRONTEND_ONLY or node.get("mode") in (_MUTED, _BYPASSED):
            continue
        info = object_info.get(node["type"])
        if info is None:
            raise ValueError(f"node {node['id']}: type {node['type']!r} is not installed on the server")
        inputs = {}
        values = node.get("widgets_values", [])
        if isinstance(values, dict):  # some custom nodes save widgets by name
            inputs.update(values)
        else:
            values = list(values)
            order = info.get("input_order") or {s: list(info["input"].get(s, {})) for s in ("required", "optional")}
            for section in ("required", "optional"):
                for name in order.get(section, []):
                    spec = info["input"][section][name]
                    typ, opts = spec[0], (spec[1] if len(spec) > 1 else {})
                    is_widget = isinstance(typ, list) or typ in _WIDGET_TYPES
                    if not is_widget or opts.get("forceInput") or not values:
                        continue
                    inputs[name] = values.pop(0)
                    if inputs[name] == "" and (isinstance(typ, list) or typ == "COMBO"):
                        inputs[name] = picks.pop(0) if picks else CKPT_NAME   # the user's pick
                    # The frontend stores extra widgets' values right after some inputs: the
                    # "control after generate" mode after seeds (flagged, or legacy by name) and
                    # the upload button after LoadImage-style combos.
                    control = opts.get("control_after_generate") or name in ("seed", "noise_seed")
                    if values and control and values[0] in ("fixed", "increment", "decrement", "randomize"):
                        values.pop(0)
                    elif values and any(k.endswith("_upload") and v for k, v in opts.items()) and \
                            values[0] in ("image", "video", "audio"):
                        values.pop(0)
        for inp in node.get("inputs", []):  # links override widget values (converted widgets)
            src = source(inp.get("link"))
            if src is not None:
                inputs[inp["name"]] = src
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs,
                                   "_meta": {"title": node.get("title", node["type"])}}
    return prompt


def without_viking(api):
    """The same graph with every Viking node taken out and its inputs wired straight through."""
    viking = {k for k, v in api.items() if v["class_type"].startswith("Viking")}
    graph = {k: json.loads(json.dumps(v)) for k, v in api.items() if k not in viking}
    for node in graph.values():
        for name, value in node["inputs"].items():
            while isinstance(value, list) and value[0] in viking:
                pin = api[value[0]]
                value = next(v for v in pin["inputs"].values() if isinstance(v, list))
            node["inputs"][name] = value
    return graph


def wait_for(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()

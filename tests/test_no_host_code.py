"""No file of a test host is tracked in this repository: ComfyUI (0.3.75, 0.33) and ComfyUI-GGUF
are other projects that the tests run, never part of this one (tests/hosts.py)."""
import hashlib
import subprocess
from pathlib import Path

import pytest

from comfy_server import COMFY_DIR, REPO_ROOT, comfy_install
from hosts import GGUF_PACK

# Files this small are boilerplate any project may share (an empty __init__.py, a one-line stub).
SMALLEST_COMPARED = 64


def tracked_files():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    return [REPO_ROOT / n for n in names.decode().split("\0") if n and (REPO_ROOT / n).is_file()]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes().strip()).hexdigest()


def test_no_tracked_archive_or_host_module_by_name():
    host_like = [p.relative_to(REPO_ROOT).as_posix() for p in tracked_files()
                 if p.name.endswith((".tar", ".tgz", ".tar.gz", ".zip"))
                 or p.relative_to(REPO_ROOT).as_posix().endswith(("comfy/model_management.py", "comfy/model_patcher.py",
                                                                  "comfy/ops.py", "comfyui_version.py"))
                 or "ComfyUI-GGUF" in p.parts]
    assert not host_like, host_like


def test_no_tracked_file_is_a_copy_of_a_host_file():
    trees = {"ComfyUI 0.3.75": COMFY_DIR, "ComfyUI 0.33": comfy_install("0.33").tree, "ComfyUI-GGUF": GGUF_PACK}
    present = {name: tree for name, tree in trees.items() if tree.is_dir()}
    missing = sorted(set(trees) - set(present))
    if not present:
        pytest.skip(f"no host tree here to compare with ({', '.join(f'{n} at {trees[n]}' for n in missing)})")
    host_digests = {}
    for name, tree in present.items():
        for path in tree.rglob("*"):
            if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts \
                    and path.stat().st_size >= SMALLEST_COMPARED and path.stat().st_size < 8 << 20:
                host_digests.setdefault(digest(path), f"{name}: {path.relative_to(tree)}")
    copies = [f"{p.relative_to(REPO_ROOT)} = {host_digests[d]}" for p in tracked_files()
              if p.stat().st_size >= SMALLEST_COMPARED and (d := digest(p)) in host_digests]
    print(f"\ncompared {len(tracked_files())} tracked files with {len(host_digests)} files of {', '.join(present)}"
          + (f"; not here: {', '.join(missing)}" if missing else ""))
    assert not copies, copies

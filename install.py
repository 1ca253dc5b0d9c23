"""Run by ComfyUI-Manager and comfy-cli after they put this folder into custom_nodes/ (with the
Python that runs ComfyUI, in this folder; Manager also after an update): installs the shipped
wheel of the native module that fits this Python (wheels/), so no Rust toolchain is needed.

- An installed `viking_native` that already matches this folder's native source (a developer's
  `pip install .`) is left alone.
- Without pip (or uv) in this Python, or if the install fails, the nodes load the same wheel
  straight from the pack (comfy_node/native.py); its extension file is extracted here already.
- With no wheel for this Python it says so, names the command that builds the module, and exits
  with 1 (the nodes still register and tell the same).

    python install.py          what the installers run
"""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def loader():
    """comfy_node/native.py's helpers, without loading the native module (nor ComfyUI)."""
    spec = importlib.util.spec_from_file_location("viking_native_loader", HERE / "comfy_node" / "native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pip_command():
    """How ComfyUI-Manager reaches pip: `python -m pip` (with -s in ComfyUI portable's embedded
    Python), else uv."""
    base = [sys.executable] + (["-s"] if "python_embeded" in sys.executable else [])
    for cmd in (base + ["-m", "pip"], base + ["-m", "uv", "pip"]):
        if subprocess.run(cmd + ["--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return cmd
    return ["uv", "pip"] if shutil.which("uv") else None


def main():
    native = loader()
    folder = native.source_hash(HERE)
    installed = native.installed_module()
    if installed and installed[1] and installed[1] == folder:
        print(f"[Viking] the installed native module matches this folder's source ({folder}): {installed[0]}")
        return 0
    wheel = native.pick_wheel(folder_hash=folder)
    if wheel is None:
        print(f"[Viking] {native.no_wheel_message()}", file=sys.stderr)
        return 1
    recorded = native.wheel_source_hash(wheel)
    if folder and recorded != folder:
        print(f"[Viking] warning: {wheel.name} was built from source {recorded}, this folder's native source "
              f"is {folder} (rebuild the wheels: {native.BUILD_WHEELS})", file=sys.stderr)
    pip = pip_command()
    if pip is not None:
        uv = "uv" in pip
        cmd = pip + ["install", "--no-deps", "--no-index", "--reinstall" if uv else "--force-reinstall", str(wheel)]
        if uv:
            cmd += ["--python", sys.executable]
        print(f"[Viking] {' '.join(cmd)}", flush=True)
        if subprocess.run(cmd).returncode == 0:
            print(f"[Viking] installed {wheel.name} (source {recorded}) into {sys.executable}")
            return 0
        print("[Viking] that install failed; the nodes load the wheel from this folder instead", file=sys.stderr)
    else:
        print("[Viking] no pip or uv in this Python; the nodes load the wheel from this folder instead")
    path = native.extract_extension(wheel)
    print(f"[Viking] {wheel.name}: extension ready at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

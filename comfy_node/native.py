"""The one place that imports the native module `viking_native`.

Where it comes from, first that loads wins:
1. an installed `viking_native` (a developer's `pip install .`, or the shipped wheel that
   install.py put there) whose source hash matches this folder's native source;
2. the shipped wheel in wheels/ that fits this Python and matches the source: its extension file
   is extracted once to wheels/.cache/ (or a user cache folder where the pack is read-only) and
   imported from there, so a folder dropped into custom_nodes/ works with no installer;
3. an installed one that does not match, then a shipped one that does not match (both work, and
   build_info() / the status say that they are stale).
With none, the nodes still register and say how to build the module (INSTALL_HINT).

VIKING_NATIVE=installed (only step 1 and 3's installed module) or =bundled (only the shipped
wheels) narrows the choice, e.g. to test one path.

No import of this module loads anything: the first use of `native`, `IMPORT_ERROR`,
`INSTALL_HINT` or `build_info()` does. install.py uses the helpers (source_hash, pick_wheel,
installed_module) without loading the module.
"""

import base64
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import re
import struct
import sys
import sysconfig
import zipfile
from pathlib import Path

MODULE = "viking_native"
DIST = "viking_engine"
PACK_DIR = Path(__file__).resolve().parent.parent
WHEELS_DIR = PACK_DIR / "wheels"
BUILD_FROM_SOURCE = "python -m pip install ."
BUILD_WHEELS = "bash scripts/build_wheels.sh"
RUSTUP = "https://rustup.rs"
# The literal the build script puts into the binary (build.rs): readable without running it.
HASH_MARKER = re.compile(rb"fnv1a64:[0-9a-f]{16}")

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


# ---- the source hash (the same as build.rs) ------------------------------------------------------
def fnv1a64(data, value=_FNV_OFFSET):
    for byte in data:
        value = ((value ^ byte) * _FNV_PRIME) & _MASK
    return value


def _skipped(name):
    return name.startswith(".") or name.endswith("~")


def source_files(root=PACK_DIR):
    """The native source's files as '/'-separated paths relative to root, sorted (build.rs's list)."""
    root = Path(root)
    files = [name for name in ("Cargo.toml", "Cargo.lock", "build.rs") if (root / name).is_file()]

    def walk(rel):
        with os.scandir(root / rel) as entries:
            for entry in entries:
                if _skipped(entry.name) or entry.is_symlink():
                    continue
                path = f"{rel}/{entry.name}"
                if entry.is_dir():
                    walk(path)
                elif entry.is_file():
                    files.append(path)

    walk("src")
    return sorted(files, key=lambda p: p.encode())


def source_hash(root=PACK_DIR):
    """`fnv1a64:<hex>` of the native source under root, as build.rs computes it; None where the
    folder holds no native source (no src/)."""
    root = Path(root)
    if not (root / "src").is_dir():
        return None
    value = _FNV_OFFSET
    for rel in source_files(root):
        data = (root / rel).read_bytes().replace(b"\r\n", b"\n")
        for part in (rel.encode(), b"\0", struct.pack("<Q", len(data)), data):
            value = fnv1a64(part, value)
    return f"fnv1a64:{value:016x}"


def recorded_hash(binary):
    """The source hash a built extension carries (bytes of the file), or None (built before the
    hash existed, or not one of ours)."""
    found = HASH_MARKER.search(binary)
    return found.group().decode() if found else None


# ---- which wheel fits this Python ----------------------------------------------------------------
def interpreter():
    """What decides which wheel fits: implementation, version, platform, glibc."""
    plat = sysconfig.get_platform()  # linux-x86_64, win-amd64, macosx-11.0-arm64, ...
    bits = struct.calcsize("P") * 8
    glibc = None
    if sys.platform.startswith("linux"):
        try:
            name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
            if name == "glibc":
                glibc = tuple(int(x) for x in version.split(".")[:2])
        except (AttributeError, ValueError, OSError):
            pass  # musl, or no confstr: no manylinux wheel fits
        arch = plat.split("-", 1)[-1]
        if bits == 32:  # a 32-bit Python on a 64-bit kernel reports the kernel's machine
            arch = {"x86_64": "i686", "aarch64": "armv7l"}.get(arch, arch)
        plat = f"linux-{arch}"
    return {
        "implementation": sys.implementation.name,
        "version": tuple(sys.version_info[:2]),
        "platform": plat,
        "glibc": glibc,
        "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    }


def describe_interpreter(interp=None):
    interp = interp or interpreter()
    text = f"{interp['implementation']} {interp['version'][0]}.{interp['version'][1]}"
    if interp.get("free_threaded"):
        text += " (free-threaded)"
    text += f" on {interp['platform']}"
    if interp.get("glibc"):
        text += " glibc %d.%d" % interp["glibc"]
    elif interp["platform"].startswith("linux-"):
        text += " (no glibc)"
    return text


_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_WINDOWS = {"win_amd64": "win-amd64", "win32": "win32", "win_arm64": "win-arm64"}


def wheel_tags(filename):
    """(python tags, abi tags, platform tags) of a wheel file name, or None."""
    parts = Path(filename).name[: -len(".whl")].split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        return None
    return tuple(part.split(".") for part in parts[-3:])


def _platform_fits(tag, interp):
    plat = interp["platform"]
    if tag == "any":
        return True
    if tag in _WINDOWS:
        return plat == _WINDOWS[tag]
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag)
    if m:
        need, arch = (int(m.group(1)), int(m.group(2))), m.group(3)
    else:
        m = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", tag)
        need, arch = (_LEGACY_MANYLINUX[m.group(1)], m.group(2)) if m else (None, None)
    if arch is not None:
        return plat == f"linux-{arch}" and interp["glibc"] is not None and interp["glibc"] >= need
    m = re.fullmatch(r"linux_(\w+)", tag)
    if m:
        return plat == f"linux-{m.group(1)}"
    m = re.fullmatch(r"macosx_\d+_\d+_(\w+)", tag)
    if m:
        arches = {"universal2": ("x86_64", "arm64")}.get(m.group(1), (m.group(1),))
        return plat.startswith("macosx-") and plat.rsplit("-", 1)[-1] in arches
    return False


def _python_fits(py_tags, abi_tags, interp):
    if interp["implementation"] != "cpython":
        return False
    for py in py_tags:
        m = re.fullmatch(r"cp(\d)(\d+)", py)
        if not m:
            continue
        version = (int(m.group(1)), int(m.group(2)))
        if "abi3" in abi_tags and not interp["free_threaded"] and interp["version"] >= version:
            return True
        if interp["version"] == version and f"cp{version[0]}{version[1]}" in abi_tags:
            return True
    return False


def wheel_fits(filename, interp=None):
    interp = interp or interpreter()
    tags = wheel_tags(str(filename))
    if tags is None:
        return False
    py_tags, abi_tags, plat_tags = tags
    return _python_fits(py_tags, abi_tags, interp) and any(_platform_fits(t, interp) for t in plat_tags)


def shipped_wheels(wheels_dir=WHEELS_DIR):
    wheels_dir = Path(wheels_dir)
    return sorted(wheels_dir.glob(f"{DIST}-*.whl")) if wheels_dir.is_dir() else []


def wheel_extension(wheel):
    """(member name, bytes) of the extension module inside a wheel, or None."""
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            base = name.rsplit("/", 1)[-1]
            if base.startswith(MODULE) and (base.endswith(".so") or base.endswith(".pyd")) and \
                    ".dist-info/" not in name:
                return name, zf.read(name)
    return None


def wheel_source_hash(wheel):
    found = wheel_extension(wheel)
    return recorded_hash(found[1]) if found else None


def pick_wheel(interp=None, wheels_dir=WHEELS_DIR, folder_hash=None):
    """The shipped wheel for this Python: one that fits and matches folder_hash when there is
    one, else one that fits; None when none fits."""
    fitting = [w for w in shipped_wheels(wheels_dir) if wheel_fits(w.name, interp)]
    if folder_hash:
        for wheel in fitting:
            if wheel_source_hash(wheel) == folder_hash:
                return wheel
    return fitting[0] if fitting else None


def no_wheel_message(interp=None, wheels_dir=WHEELS_DIR):
    shipped = ", ".join(w.name for w in shipped_wheels(wheels_dir)) or "none"
    return (f"Viking Engine ships no native module for this Python ({describe_interpreter(interp)}; "
            f"shipped wheels: {shipped}). Build it from this folder with the Python that runs "
            f"ComfyUI: `{BUILD_FROM_SOURCE}` (needs Rust: {RUSTUP}), then restart ComfyUI.")


# ---- an installed module, found without importing it --------------------------------------------
def installed_module():
    """(extension file, its recorded source hash) of the `viking_native` that `import` would
    find, without importing it; None when there is none. A source file found instead (no
    extension) gives (that file, None)."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # maturin's layout: a package around the extension
        for folder in spec.submodule_search_locations:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                candidate = Path(folder) / f"{MODULE}{suffix}"
                if candidate.is_file():
                    return candidate, recorded_hash(candidate.read_bytes())
    origin = Path(spec.origin) if spec.origin and spec.has_location else None
    if origin is None or not origin.is_file():
        return None
    is_extension = any(origin.name.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES)
    return origin, recorded_hash(origin.read_bytes()) if is_extension else None


def installed_from():
    """Where pip installed viking_engine from (direct_url.json's URL), or None."""
    try:
        from importlib import metadata
        text = metadata.distribution(DIST).read_text("direct_url.json")
        return json.loads(text).get("url") if text else None
    except Exception:
        return None


# ---- extraction of a shipped extension (the drop-in path) ----------------------------------------
def _writable_dir(path):
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def cache_dir():
    inside = WHEELS_DIR / ".cache"
    if _writable_dir(inside):
        return inside
    base = os.environ.get("LOCALAPPDATA") if os.name == "nt" else os.environ.get("XDG_CACHE_HOME")
    return Path(base or Path.home() / ".cache") / "viking_engine"


def extract_extension(wheel, cache=None):
    """The wheel's extension file, extracted once (a folder per content hash, so a file loaded by
    another process is never overwritten) and checked against its content hash."""
    name, data = wheel_extension(wheel)
    digest = hashlib.sha256(data).hexdigest()
    folder = Path(cache or cache_dir()) / digest[:16]
    target = folder / name.rsplit("/", 1)[-1]
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == digest:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    temp = folder / f".{target.name}.{os.getpid()}.tmp"
    temp.write_bytes(data)
    try:
        os.replace(temp, target)
    except OSError:  # Windows: another process has it loaded; that copy is the same bytes
        temp.unlink()
        if not (target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == digest):
            raise
    return target


def _drop_other_extractions(keep):
    """Best effort: earlier extractions (older wheels) go; one still loaded elsewhere stays
    (Windows refuses to delete it, Linux keeps it alive for whoever has it mapped)."""
    import shutil
    for folder in keep.parent.iterdir():
        if folder.is_dir() and folder != keep:
            shutil.rmtree(folder, ignore_errors=True)


def _import_extension(path):
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(MODULE, None)
        raise
    return module


# ---- the load ------------------------------------------------------------------------------------
_state = None


def _load():
    """Loads the module once (see the module docstring for the order) and records how."""
    info = {"loaded": False, "origin": None, "file": None, "wheel": None, "module_source_hash": None,
            "source_hash": None, "matches_source": None, "python": None, "problem": None}
    module, error = None, None
    try:
        info["python"] = describe_interpreter()
        folder = info["source_hash"] = source_hash()
        mode = os.environ.get("VIKING_NATIVE", "auto").strip().lower()
        attempts = []  # (origin, file, wheel) in order
        if MODULE in sys.modules:
            attempts.append(("preloaded", None, None))
        else:
            installed = installed_module() if mode in ("auto", "installed") else None
            wheel = pick_wheel(folder_hash=folder) if mode in ("auto", "bundled") else None
            wheel_hash = wheel_source_hash(wheel) if wheel else None
            current = lambda h: folder is None or h == folder  # noqa: E731
            if installed and current(installed[1]):
                attempts.append(("installed", installed[0], None))
            if wheel and current(wheel_hash):
                attempts.append(("bundled", None, wheel))
            if installed and not current(installed[1]):
                attempts.append(("installed", installed[0], None))
            if wheel and not current(wheel_hash):
                attempts.append(("bundled", None, wheel))
        errors = []
        for origin, file, wheel in attempts:
            try:
                if origin == "preloaded":
                    module = sys.modules[MODULE]
                elif origin == "installed":
                    module = importlib.import_module(MODULE)
                else:
                    file = extract_extension(wheel)
                    module = _import_extension(file)
                    _drop_other_extractions(file.parent)
            except Exception as e:  # ImportError, or OSError from a broken file
                errors.append(f"{origin} {file or wheel}: {e}")
                continue
            info.update(loaded=True, origin=origin, wheel=wheel.name if wheel else None)
            inner = getattr(module, MODULE, None)  # maturin's package: the extension inside
            info["file"] = str(file or getattr(inner, "__file__", None) or getattr(module, "__file__", None))
            if origin == "installed":
                url = installed_from()
                if url and url.endswith(".whl"):
                    info["wheel"] = url.rsplit("/", 1)[-1]
            info["module_source_hash"] = getattr(module, "__source_hash__", None)
            if folder is not None:
                info["matches_source"] = info["module_source_hash"] == folder
            break
        if module is None:
            build = (f"Build it from this folder with the Python that runs ComfyUI: "
                     f"`{BUILD_FROM_SOURCE}` (needs Rust: {RUSTUP}), then restart ComfyUI.")
            if mode != "installed" and not any(origin == "bundled" for origin, _, _ in attempts):
                problem = no_wheel_message()
            elif not attempts:
                problem = f"Viking Engine's native module is not installed (VIKING_NATIVE={mode}). {build}"
            else:
                problem = f"Viking Engine's native module did not load ({'; '.join(errors)}). {build}"
            error = ImportError("; ".join(errors) or f"no {MODULE} for {info['python']}")
            info["problem"] = problem
        elif info["matches_source"] is False:
            info["problem"] = (
                f"it was built from source {info['module_source_hash'] or 'of unknown hash'}, but this "
                f"folder's native source is {folder}: rebuild it (`{BUILD_FROM_SOURCE}` for this Python, `{BUILD_WHEELS}` for "
                f"the shipped wheels)")
    except Exception as e:  # never let the selection itself break the node's import
        module, error = None, e
        info["problem"] = info["problem"] or f"Viking Engine could not look for its native module: {e!r}"
    return module, error, info


def _ensure():
    global _state
    if _state is None:
        _state = _load()
        module, error, info = _state
        log = logging.getLogger("viking_engine")
        if module is None:
            log.warning("[Viking] %s (%s)", info["problem"], error)
        elif info["problem"]:
            log.warning("[Viking] native module: %s. %s", describe_build(info), info["problem"])
        else:
            log.info("[Viking] native module: %s", describe_build(info))
    return _state


def describe_build(info=None):
    """One line: where the module came from and whether it matches the source."""
    info = info or build_info()
    if not info["loaded"]:
        return f"not loaded: {info['problem']}"
    match = {True: "matches this folder's source", False: "does NOT match this folder's source",
             None: "no native source in this folder to compare"}[info["matches_source"]]
    wheel = f" from {info['wheel']}" if info["wheel"] else ""
    return (f"{info['origin']}{wheel}, {info['file']}, source {info['module_source_hash']} "
            f"({match}); {info['python']}")


def build_info():
    """Where the native module was loaded from and whether it matches this folder's source:
    {loaded, origin (installed / bundled / preloaded), file, wheel, module_source_hash,
    source_hash (this folder's), matches_source (None without native source here), python,
    problem (text, None when all is well)}."""
    return dict(_ensure()[2])


def __getattr__(name):  # PEP 562: `native`, `IMPORT_ERROR`, `INSTALL_HINT` load on first use
    if name in ("native", "IMPORT_ERROR", "INSTALL_HINT"):
        module, error, info = _ensure()
        hint = info["problem"] if module is None else None
        globals().update(native=module, IMPORT_ERROR=error, INSTALL_HINT=hint or no_wheel_message())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def require():
    """The native module, or a RuntimeError that says how to get it."""
    module, error, info = _ensure()
    if module is None:
        raise RuntimeError(f"{info['problem']} (import error: {error})")
    return module

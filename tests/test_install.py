"""Installing the pack as users do, with no Rust toolchain: the shipped wheels in wheels/ (one per
platform, manylinux for Linux, matching the native source), install.py as ComfyUI-Manager and
comfy-cli run it, the drop-in path of comfy_node/native.py, and a real ComfyUI server in a fresh
venv that pins with the module from a shipped wheel.

The fresh venvs borrow ComfyUI's prerequisites (torch & co., 5.5 GB) from .venv through a folder
of symlinks to every entry of .venv's site-packages except viking_native / viking_engine, so the
module can only come from the pack. The tests named *shipped* (no server) are what
scripts/build_wheels.sh runs after a build; none of them needs cargo."""

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from comfy_node import native as loader  # the helpers; importing it loads nothing
from comfy_server import (ComfyServer, VENV_PYTHON, api_prompt_from_ui_workflow,
                          cached_checkpoint, comfy_install, comfy_unavailable, prepare_base_dir)
from memory_probe import locked_bytes

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO / "wheels"
# platform -> (a tag the wheel's file name must carry, ELF machine or None for Windows)
PLATFORMS = {
    "linux-x86_64": ("manylinux_2_17_x86_64", 62),
    "linux-aarch64": ("manylinux_2_17_aarch64", 183),
    "windows-amd64": ("win_amd64", None),
}
MANYLINUX2014_LIBS = {"libc.so.6", "libpthread.so.0", "libdl.so.2", "libm.so.6", "librt.so.1",
                      "libgcc_s.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
comfy = pytest.mark.host("0.3.75")


def shipped(platform):
    tag = PLATFORMS[platform][0]
    found = [w for w in loader.shipped_wheels(WHEELS) if tag in loader.wheel_tags(w.name)[2]]
    assert len(found) == 1, f"wheels/ should hold one {platform} wheel, has {[w.name for w in found]}: " \
                            f"run `{loader.BUILD_WHEELS}`"
    return found[0]


# ---- the source hash ---------------------------------------------------------------------------
def test_fnv1a64_known_vectors():
    assert loader.fnv1a64(b"") == 0xCBF29CE484222325
    assert loader.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert loader.fnv1a64(b"foobar") == 0x85944171F73967E8


def test_source_hash_covers_the_native_source_only(tmp_path):
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "lib.rs").write_bytes(b"fn a() {}\n")
    (tmp_path / "src" / "sub" / "m.rs").write_bytes(b"x\n")
    (tmp_path / "Cargo.toml").write_bytes(b"[package]\n")
    # The byte stream build.rs hashes: per file (sorted paths) path, 0, length (u64 LE), content.
    stream = b"".join(p.encode() + b"\0" + struct.pack("<Q", len(c)) + c for p, c in
                      [("Cargo.toml", b"[package]\n"), ("src/lib.rs", b"fn a() {}\n"), ("src/sub/m.rs", b"x\n")])
    first = loader.source_hash(tmp_path)
    assert first == f"fnv1a64:{loader.fnv1a64(stream):016x}"
    (tmp_path / "src" / "lib.rs~").write_bytes(b"backup")
    (tmp_path / "src" / ".lib.rs.swp").write_bytes(b"swap")
    (tmp_path / "README.md").write_bytes(b"not native source")
    assert loader.source_hash(tmp_path) == first
    (tmp_path / "src" / "lib.rs").write_bytes(b"fn a() {}\r\n")  # a Windows checkout
    assert loader.source_hash(tmp_path) == first
    (tmp_path / "src" / "new.rs").write_bytes(b"")
    assert loader.source_hash(tmp_path) != first
    assert loader.source_hash(tmp_path / "nowhere") is None


# ---- the shipped wheels --------------------------------------------------------------------------
def test_shipped_wheels_match_the_native_source():
    """No drift: every shipped wheel was built from the native source in this checkout."""
    source = loader.source_hash(REPO)
    stale = {}
    for platform in PLATFORMS:
        wheel = shipped(platform)
        recorded = loader.wheel_source_hash(wheel)
        if recorded != source:
            stale[wheel.name] = recorded
    assert not stale, (f"shipped wheels built from other source than src/ + Cargo.toml + Cargo.lock + build.rs "
                       f"({source}): {stale}; rebuild them with `{loader.BUILD_WHEELS}` and commit wheels/")


def test_shipped_wheels_are_abi3_small_and_complete():
    stub = REPO / "viking_native.pyi"
    for platform in PLATFORMS:
        wheel = shipped(platform)
        py, abi, _ = loader.wheel_tags(wheel.name)
        assert py == ["cp39"] and abi == ["abi3"], wheel.name
        assert wheel.stat().st_size < 1 << 20, (wheel.name, wheel.stat().st_size)
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            ext = "viking_native/viking_native." + ("pyd" if platform.startswith("windows") else "abi3.so")
            assert ext in names, names
            assert not any("sboms/" in n for n in names), names  # no timestamped SBOM: repeatable builds
            if stub.exists():  # the typed stub ships with the module
                assert zf.read("viking_native/__init__.pyi") == stub.read_bytes(), \
                    f"{wheel.name} ships another viking_native.pyi than the checkout's: run `{loader.BUILD_WHEELS}`"
                assert "viking_native/py.typed" in names


def elf_info(data):
    """(e_machine, NEEDED libraries, {version names needed}, exported dynamic symbols) of an ELF64 LE."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not an ELF64 little-endian file"
    machine = struct.unpack_from("<H", data, 0x12)[0]
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def strtab(index, offset):
        base = sections[index][4] + offset
        return data[base:data.index(b"\0", base)].decode()

    needed, versions, exports = set(), set(), set()
    for _, kind, _, _, off, size, link, info, _, entsize in sections:
        if kind == 6:  # SHT_DYNAMIC
            for pos in range(off, off + size, 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == 1:  # DT_NEEDED
                    needed.add(strtab(link, value))
        elif kind == 0x6FFFFFFE:  # SHT_GNU_verneed
            pos = off
            for _ in range(info):
                _, count, _, aux, nxt = struct.unpack_from("<HHIII", data, pos)
                apos = pos + aux
                for _ in range(count):
                    _, _, _, name, anext = struct.unpack_from("<IHHII", data, apos)
                    versions.add(strtab(link, name))
                    apos += anext
                pos += nxt
        elif kind == 11:  # SHT_DYNSYM
            for pos in range(off, off + size, entsize):
                name, st_info, _, shndx = struct.unpack_from("<IBBH", data, pos)
                if shndx != 0 and st_info >> 4 in (1, 2) and name:  # defined, GLOBAL or WEAK
                    exports.add(strtab(link, name))
    return machine, needed, versions, exports


def pe_info(data):
    """(machine, {dll: [imported names]}, [exported names]) of a PE32+ file."""
    pe, = struct.unpack_from("<I", data, 0x3C)
    assert data[pe:pe + 4] == b"PE\0\0", "not a PE file"
    machine, nsections = struct.unpack_from("<HH", data, pe + 4)
    opt_size, = struct.unpack_from("<H", data, pe + 20)
    opt = pe + 24
    assert struct.unpack_from("<H", data, opt)[0] == 0x20B, "not PE32+"
    export_rva, _, import_rva, _ = struct.unpack_from("<IIII", data, opt + 112)
    sections = [struct.unpack_from("<8sIIII", data, opt + opt_size + 40 * i) for i in range(nsections)]

    def at(rva):
        for _, vsize, vaddr, rawsize, rawptr in sections:
            if vaddr <= rva < vaddr + max(vsize, rawsize):
                return rva - vaddr + rawptr
        raise ValueError(f"rva {rva:#x} outside every section")

    def cstr(rva):
        pos = at(rva)
        return data[pos:data.index(b"\0", pos)].decode()

    imports = {}
    pos = at(import_rva)
    while True:
        lookup, _, _, name, first = struct.unpack_from("<IIIII", data, pos)
        if not name:
            break
        names, tpos = [], at(lookup or first)
        while True:
            thunk, = struct.unpack_from("<Q", data, tpos)
            if not thunk:
                break
            names.append(f"#{thunk & 0xFFFF}" if thunk >> 63 else cstr((thunk & 0x7FFFFFFF) + 2))
            tpos += 8
        imports.setdefault(cstr(name).lower(), []).extend(names)
        pos += 20
    exports = []
    if export_rva:
        count, _, names_rva = struct.unpack_from("<III", data, at(export_rva) + 24)
        exports = [cstr(struct.unpack_from("<I", data, at(names_rva) + 4 * i)[0]) for i in range(count)]
    return machine, imports, exports


def test_shipped_linux_wheels_are_manylinux2014():
    """manylinux2014 = glibc 2.17: the versioned glibc symbols the extension needs go no higher,
    and it links only the libraries that policy allows."""
    for platform in ("linux-x86_64", "linux-aarch64"):
        wheel = shipped(platform)
        assert "manylinux2014_" + platform.split("-")[1] in loader.wheel_tags(wheel.name)[2], wheel.name
        machine, needed, versions, exports = elf_info(loader.wheel_extension(wheel)[1])
        assert machine == PLATFORMS[platform][1], (wheel.name, machine)
        assert needed <= MANYLINUX2014_LIBS, needed - MANYLINUX2014_LIBS
        glibc = [tuple(map(int, v[6:].split("."))) for v in versions if v.startswith("GLIBC_")]
        assert glibc and max(glibc) <= (2, 17), sorted(versions)
        assert not {v for v in versions if v.startswith(("GLIBCXX_", "CXXABI_"))}, versions
        assert "PyInit_viking_native" in exports


def test_shipped_windows_wheel_is_abi3_with_system_dlls_only():
    wheel = shipped("windows-amd64")
    machine, imports, exports = pe_info(loader.wheel_extension(wheel)[1])
    assert machine == 0x8664
    assert "PyInit_viking_native" in exports
    assert "python3.dll" in imports, imports  # the stable ABI: any CPython 3.9+ on Windows
    assert not [d for d in imports if re.fullmatch(r"python3\d+\.dll", d)], imports
    # Nothing from MinGW that a Windows machine lacks (libgcc_s_seh-1, libwinpthread-1, ...).
    assert not [d for d in imports if d.startswith("lib")], imports


# ---- which wheel fits which Python ---------------------------------------------------------------
def interp(platform="linux-x86_64", version=(3, 11), glibc=(2, 36), implementation="cpython", free_threaded=False):
    return {"implementation": implementation, "version": version, "platform": platform, "glibc": glibc,
            "free_threaded": free_threaded}


@pytest.mark.parametrize("python, wanted", [
    (interp(), "linux-x86_64"),
    (interp(version=(3, 9), glibc=(2, 17)), "linux-x86_64"),
    (interp("linux-aarch64", (3, 12), (2, 31)), "linux-aarch64"),
    (interp("win-amd64", (3, 13), None), "windows-amd64"),
    (interp(glibc=(2, 12)), None),                      # CentOS 6
    (interp(glibc=None), None),                         # musl (Alpine)
    (interp("linux-i686"), None),
    (interp("win32", (3, 12), None), None),
    (interp("macosx-11.0-arm64", (3, 12), None), None),
    (interp(version=(3, 8)), None),
    (interp(version=(3, 13), free_threaded=True), None),  # no abi3 for free-threaded builds
    (interp(implementation="pypy"), None),
])
def test_shipped_wheel_selection(python, wanted):
    pick = loader.pick_wheel(python, WHEELS)
    if wanted is None:
        assert pick is None, pick
        text = loader.no_wheel_message(python, WHEELS)
        assert "python -m pip install ." in text and loader.describe_interpreter(python) in text, text
    else:
        assert pick == shipped(wanted)


# ---- the Windows extension loads under Wine ------------------------------------------------------
LOAD_PYD_C = r"""
#include <windows.h>
#include <stdio.h>
int main(int argc, char **argv) {
    HMODULE module = LoadLibraryA(argv[1]);
    if (!module) { printf("LoadLibrary failed: error %lu\n", GetLastError()); return 1; }
    if (!GetProcAddress(module, "PyInit_viking_native")) { printf("no PyInit_viking_native\n"); return 2; }
    printf("loaded %s: PyInit_viking_native found\n", argv[1]);
    return 0;
}
"""


@pytest.mark.skipif(not (shutil.which("x86_64-w64-mingw32-gcc") and shutil.which("wine")),
                    reason="needs MinGW and Wine (scripts/setup_env.sh installs them as root)")
def test_shipped_windows_pyd_loads_under_wine(tmp_path):
    """The shipped .pyd is a loadable DLL: Windows' loader (Wine's) resolves all its imports and
    finds PyInit_viking_native. No Windows CPython can be had here, so python3.dll is a stand-in
    exporting every name the extension imports from it (never called)."""
    wheel = shipped("windows-amd64")
    data = loader.wheel_extension(wheel)[1]
    (tmp_path / "viking_native.pyd").write_bytes(data)
    names = pe_info(data)[1]["python3.dll"]
    (tmp_path / "python3.c").write_text("".join(f"__declspec(dllexport) void {n}(void) {{}}\n" for n in names))
    (tmp_path / "load_pyd.c").write_text(LOAD_PYD_C)
    gcc = "x86_64-w64-mingw32-gcc"
    subprocess.run([gcc, "-shared", "-o", tmp_path / "python3.dll", tmp_path / "python3.c"], check=True)
    subprocess.run([gcc, "-O2", "-o", tmp_path / "load_pyd.exe", tmp_path / "load_pyd.c"], check=True)
    # Rust's std imports ProcessPrng from bcryptprimitives.dll, which Wine 8 lacks (as in
    # scripts/windows_check.sh): the project's stand-in goes next to the extension.
    subprocess.run([gcc, "-shared", "-O2", "-o", tmp_path / "bcryptprimitives.dll",
                    REPO / "tests" / "windows" / "bcryptprimitives.c", "-ladvapi32"], check=True)
    prefix = REPO / "target" / "wineprefix"  # scripts/windows_check.sh's; Wine makes it on first use
    prefix.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WINEDEBUG": "-all", "WINEPREFIX": str(prefix)}
    run = subprocess.run(["wine", "load_pyd.exe", "viking_native.pyd"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "PyInit_viking_native found" in run.stdout, (run.returncode, run.stdout, run.stderr[-2000:])


# ---- fresh venvs without cargo -------------------------------------------------------------------
def site_packages(python):
    return Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())


def make_fresh_venv(path, with_pip=True, base=VENV_PYTHON):
    """A new venv of `base`'s Python whose only extra path is a folder of symlinks to base's
    site-packages, minus viking_native / viking_engine (and the venv's own tools)."""
    subprocess.run([str(base), "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)], check=True)
    python = path / "bin" / "python"
    borrowed = path / "borrowed"
    borrowed.mkdir()
    skip = ("viking_native", "viking_engine", "pip", "_distutils_hack", "setuptools", "pkg_resources", "__pycache__")
    for entry in site_packages(base).iterdir():
        name = entry.name.lower()
        if name.startswith(skip) or name.endswith(".pth"):
            continue
        (borrowed / entry.name).symlink_to(entry)
    (site_packages(python) / "borrowed_prerequisites.pth").write_text(f"{borrowed}\n")
    return python


def no_cargo_env(python):
    """Environment for the fresh venv: its bin first, only system folders after it (no cargo)."""
    path = os.pathsep.join([str(python.parent), "/usr/local/bin", "/usr/bin", "/bin"])
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None, path
    return {"PATH": path, "CARGO_HOME": "/nonexistent", "RUSTUP_HOME": "/nonexistent", "PYTHONPATH": "",
            "VIRTUAL_ENV": str(python.parent.parent)}


def run_py(python, args, cwd, env, check=True):
    result = subprocess.run([str(python), *args], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                            timeout=300)
    if check:
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def install_like_comfyui_manager(python, pack, env):
    """What ComfyUI-Manager runs in the pack's folder after cloning it: `pip install <line>` for
    each requirements.txt line that is not a comment, then `python install.py`; and comfy-cli's
    `pip install -r requirements.txt`."""
    for line in (pack / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            run_py(python, ["-m", "pip", "install", line], pack, env)
    run_py(python, ["-m", "pip", "install", "-r", str(pack / "requirements.txt")], pack, env)
    return run_py(python, ["install.py"], pack, env)


def mapped_viking_files(pid):
    """The viking_native files mapped into a process (what it really loaded)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split(None, 5)[5] for line in maps if len(line.split(None, 5)) == 6 and "viking_native" in line}


def pin_checkpoint(server):
    ui = json.loads((REPO / "workflows" / "viking_pin_checkpoint.json").read_text())
    before = locked_bytes(server.pid)
    server.run_prompt(api_prompt_from_ui_workflow(ui, server.object_info()))
    return locked_bytes(server.pid) - before


@pytest.fixture(scope="module")
def checkpoint():
    return cached_checkpoint()


VERSIONS = pytest.mark.parametrize("version", ["0.3.75", "0.33"])


def fresh_comfy_venv(version, path, with_pip=True):
    """A fresh venv (see make_fresh_venv) of the Python that runs that ComfyUI: 3.11 for 0.3.75,
    3.12 for 0.33."""
    why = comfy_unavailable(version)
    if why:
        pytest.skip(why)
    return make_fresh_venv(path, with_pip, base=comfy_install(version).python)


@VERSIONS
def test_comfyui_manager_install_without_cargo_pins_with_a_prebuilt_wheel(tmp_path, checkpoint, version):
    python = fresh_comfy_venv(version, tmp_path / "venv")
    env = no_cargo_env(python)
    assert run_py(python, ["-c", "import importlib.util as u; print(u.find_spec('viking_native'))"], tmp_path,
                  env).stdout.strip() == "None"
    base = prepare_base_dir(tmp_path / "base", checkpoint=checkpoint, custom_nodes={"viking_engine": REPO})
    pack = base / "custom_nodes" / "viking_engine"
    wheel = loader.pick_wheel()  # the interpreter's platform: the same for 3.11 and 3.12 here
    out = install_like_comfyui_manager(python, pack, env)
    assert f"installed {wheel.name}" in out.stdout, (out.stdout, out.stderr)
    member, data = loader.wheel_extension(wheel)
    installed = site_packages(python) / member
    assert installed.read_bytes() == data
    # Once more (ComfyUI-Manager runs it again after an update): nothing to do.
    if loader.wheel_source_hash(wheel) == loader.source_hash(pack):
        assert "matches this folder's source" in run_py(python, ["install.py"], pack, env).stdout

    with ComfyServer(base, version=version, python=python, env=env) as server:
        assert pin_checkpoint(server) > 100e6  # the synthetic SD1.5's weights, page-locked
        assert mapped_viking_files(server.pid) == {str(installed)}
        log = server.log_text()
    assert f"[Viking] native module: installed from {wheel.name}, {installed}" in log, log[-3000:]


@VERSIONS
def test_drop_in_without_any_installer_pins_with_a_prebuilt_wheel(tmp_path, checkpoint, version):
    python = fresh_comfy_venv(version, tmp_path / "venv", with_pip=False)
    env = no_cargo_env(python)
    base = prepare_base_dir(tmp_path / "base", checkpoint=checkpoint, custom_nodes={"viking_engine": REPO})
    pack = base / "custom_nodes" / "viking_engine"
    wheel = loader.pick_wheel()
    member, data = loader.wheel_extension(wheel)
    extracted = pack / "wheels" / ".cache" / hashlib.sha256(data).hexdigest()[:16] / Path(member).name
    with ComfyServer(base, version=version, python=python, env=env) as server:
        assert pin_checkpoint(server) > 100e6
        assert mapped_viking_files(server.pid) == {str(extracted)}
        log = server.log_text()
    assert extracted.read_bytes() == data
    assert f"[Viking] native module: bundled from {wheel.name}, {extracted}" in log, log[-3000:]


BUILD_INFO = ("import importlib.util, json, sys; "
              "spec = importlib.util.spec_from_file_location('vn_loader', sys.argv[1]); "
              "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
              "info = m.build_info(); print(json.dumps(info)); "
              "print('MODULE', m.native.__file__ if m.native else None); "
              "m.require()")


@comfy
def test_build_info_tells_origin_staleness_and_how_to_build(tmp_path):
    python = make_fresh_venv(tmp_path / "venv", with_pip=False)
    env = no_cargo_env(python)
    pack = prepare_base_dir(tmp_path / "base", custom_nodes={"viking_engine": REPO}) / "custom_nodes" / "viking_engine"
    script = str(pack / "comfy_node" / "native.py")

    def build_info():
        result = run_py(python, ["-c", BUILD_INFO, script], tmp_path, env, check=False)
        return json.loads(result.stdout.splitlines()[0]), result

    wheel = loader.pick_wheel()
    info, result = build_info()
    assert result.returncode == 0, result.stderr
    assert info["loaded"] and info["origin"] == "bundled" and info["wheel"] == wheel.name
    assert info["module_source_hash"] == loader.wheel_source_hash(wheel)
    assert info["source_hash"] == loader.source_hash(REPO)
    assert info["matches_source"] == (info["module_source_hash"] == info["source_hash"])

    # A source change the wheels were not rebuilt for: still loads, and says it is stale.
    with open(pack / "src" / "lib.rs", "a") as f:
        f.write("\n// edited\n")
    info, result = build_info()
    assert result.returncode == 0 and info["loaded"] and info["matches_source"] is False, info
    assert loader.BUILD_WHEELS in info["problem"] and "python -m pip install ." in info["problem"], info

    # No wheel for this Python: the nodes' error and install.py name the command that builds it.
    for wheel_file in loader.shipped_wheels(pack / "wheels"):
        wheel_file.unlink()
    shutil.rmtree(pack / "wheels" / ".cache")
    info, result = build_info()
    assert not info["loaded"] and result.returncode != 0
    assert "ships no native module for this Python" in info["problem"], info
    assert "`python -m pip install .`" in info["problem"] and "`python -m pip install .`" in result.stderr
    pip_python = make_fresh_venv(tmp_path / "venv2")
    out = run_py(pip_python, ["install.py"], pack, no_cargo_env(pip_python), check=False)
    assert out.returncode == 1 and "`python -m pip install .`" in out.stderr, (out.stdout, out.stderr)

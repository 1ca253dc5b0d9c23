#!/usr/bin/env bash
# Builds the prebuilt wheels of the native module that the pack ships in wheels/, so that users
# need no Rust toolchain (install.py and comfy_node/native.py pick the one for their Python):
#
#   bash scripts/build_wheels.sh              all three, then the shipped-wheel tests
#   bash scripts/build_wheels.sh linux-x86_64 linux-aarch64 windows-amd64   (any subset)
#
#   linux-x86_64, linux-aarch64  abi3 (CPython 3.9+), manylinux2014 = glibc 2.17+: zig (the
#                                `ziglang` package from PyPI, put into .venv) links against
#                                glibc 2.17's symbols, so the wheels load on distributions older
#                                than the build machine
#   windows-amd64                abi3, MinGW cross-build (x86_64-w64-mingw32-gcc), as
#                                scripts/windows_check.sh builds and tests it
#
# Re-run after any change to the native source (src/, Cargo.toml, Cargo.lock, build.rs): each
# wheel records the hash of the source it was built from, and tests/test_install.py fails while
# a shipped wheel does not match the source. The builds are repeatable: the same source and the
# same toolchain give byte-identical wheels (no local paths in the binaries, no SBOM timestamp),
# so an unchanged source leaves wheels/ unchanged in git. Incremental: its own cargo target
# folder (target/wheels-build), so a rebuild after a source change takes about a minute.
# Needs: .venv (scripts/setup_env.sh), rustup, and for Windows gcc-mingw-w64-x86-64.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
VENV="${VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
OUT="$ROOT/wheels"
STAGE="$ROOT/target/wheels-stage"
ZIGLANG_VERSION="0.17.1"   # the zig the shipped wheels were built with
log() { printf '[wheels] %s\n' "$*"; }

[[ -x "$VENV/bin/maturin" ]] || { log "no maturin in $VENV: run bash scripts/setup_env.sh venv"; exit 1; }
command -v rustup >/dev/null || { log "no rustup: install Rust from https://rustup.rs"; exit 1; }

PLATFORMS=("$@")
[[ ${#PLATFORMS[@]} -gt 0 ]] || PLATFORMS=(linux-x86_64 linux-aarch64 windows-amd64)
declare -A TARGET=([linux-x86_64]=x86_64-unknown-linux-gnu [linux-aarch64]=aarch64-unknown-linux-gnu
                   [windows-amd64]=x86_64-pc-windows-gnu)
declare -A WHEEL_GLOB=([linux-x86_64]='*manylinux*x86_64.whl' [linux-aarch64]='*manylinux*aarch64.whl'
                       [windows-amd64]='*win_amd64.whl')
for p in "${PLATFORMS[@]}"; do
    [[ -n "${TARGET[$p]:-}" ]] || { log "unknown platform $p (linux-x86_64, linux-aarch64, windows-amd64)"; exit 2; }
done

if [[ " ${PLATFORMS[*]} " == *" linux-"* ]] && ! "$PY" -m ziglang version >/dev/null 2>&1; then
    log "pip install ziglang==$ZIGLANG_VERSION (into $VENV)"
    "$PY" -m pip install -q "ziglang==$ZIGLANG_VERSION"
fi
if [[ " ${PLATFORMS[*]} " == *" windows-amd64 "* ]] && ! command -v x86_64-w64-mingw32-gcc >/dev/null; then
    log "no MinGW (x86_64-w64-mingw32-gcc): apt-get install gcc-mingw-w64-x86-64, or leave windows-amd64 out"
    exit 1
fi
targets=()
for p in "${PLATFORMS[@]}"; do targets+=("${TARGET[$p]}"); done
rustup target add "${targets[@]}" >/dev/null

# Repeatable binaries: the paths of this checkout and of cargo's registry stay out of them
# (panic messages name source files), and the wheel builds keep their own incremental cache.
CARGO_HOME_DIR="${CARGO_HOME:-$HOME/.cargo}"
export RUSTFLAGS="${RUSTFLAGS:-} --remap-path-prefix=$ROOT=. --remap-path-prefix=$CARGO_HOME_DIR=/cargo"
export CARGO_TARGET_DIR="$ROOT/target/wheels-build"
export SOURCE_DATE_EPOCH=315532800   # 1980-01-01, the zip epoch maturin writes anyway
export PATH="$VENV/bin:$PATH"        # maturin finds zig as `python -m ziglang`

rm -rf "$STAGE"
mkdir -p "$STAGE" "$OUT"
for p in "${PLATFORMS[@]}"; do
    t="${TARGET[$p]}"
    log "$p: maturin build --release --target $t"
    args=(build --release --strip --target "$t" --out "$STAGE/$p" --quiet)
    [[ "$p" == linux-* ]] && args+=(--zig --compatibility manylinux2014)
    started=$SECONDS
    mkdir -p "$STAGE/$p"
    if ! "$VENV/bin/maturin" "${args[@]}" >"$STAGE/$p/build.log" 2>&1; then
        cat "$STAGE/$p/build.log"; log "$p: maturin failed"; exit 1
    fi
    shopt -s nullglob
    built=("$STAGE/$p"/${WHEEL_GLOB[$p]})
    shopt -u nullglob
    [[ ${#built[@]} -eq 1 ]] || { log "$p: expected one wheel in $STAGE/$p, got: ${built[*]:-none}"; exit 1; }
    rm -f "$OUT"/${WHEEL_GLOB[$p]}
    cp "${built[0]}" "$OUT/"
    log "$p: $(basename "${built[0]}") ($(( $(stat -c %s "${built[0]}") / 1024 )) KiB, $(( SECONDS - started )) s)"
done
rm -rf "$STAGE"

# What each shipped wheel needs from the system, and the source it records.
"$PY" - "$OUT" <<'EOF'
import subprocess, sys, zipfile, re
from pathlib import Path
sys.path.insert(0, ".")
import importlib.util
spec = importlib.util.spec_from_file_location("viking_native_loader", "comfy_node/native.py")
loader = importlib.util.module_from_spec(spec); spec.loader.exec_module(loader)
source = loader.source_hash()
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    member, data = loader.wheel_extension(wheel)
    recorded = loader.recorded_hash(data)
    note = "matches the source" if recorded == source else f"DOES NOT match the source ({source})"
    print(f"[wheels] {wheel.name}: {member}, built from {recorded}, {note}")
    tmp = Path("target") / "wheels-inspect"
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / Path(member).name
    path.write_bytes(data)
    try:
        if member.endswith(".so"):
            out = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True).stdout
            versions = sorted(set(re.findall(r"GLIBC_([0-9.]+)", out)), key=lambda v: tuple(map(int, v.split("."))))
            print(f"[wheels]   glibc symbol versions: {' '.join(versions) or '(objdump could not read it)'}")
        else:
            out = subprocess.run(["objdump", "-p", str(path)], capture_output=True, text=True).stdout
            dlls = sorted(set(re.findall(r"DLL Name: (\S+)", out)), key=str.lower)
            print(f"[wheels]   DLLs: {' '.join(dlls)}")
    except FileNotFoundError:
        print("[wheels]   (no objdump here to list what it needs)")
EOF
rm -rf "$ROOT/target/wheels-inspect"
log "checking the shipped wheels: pytest tests/test_install.py -k shipped"
"$PY" -m pytest tests/test_install.py -q -k shipped -p no:cacheprovider

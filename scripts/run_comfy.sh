#!/usr/bin/env bash
# The main job: installs what is needed (scripts/setup_env.sh), then starts a real ComfyUI with
# Viking Engine, runs the example workflow and prints Viking's status. Arguments go to
# scripts/run_comfy.py (--once to stop after the status, --gpu on a CUDA machine, --port N).
# Ctrl-C, SIGTERM or SIGHUP (also to a background job) stop the ComfyUI server it started.
#
# ComfyUI version: 0.3.75 by default; `--comfy 0.33` runs ComfyUI 0.33 instead: its tree is a
# test host outside the repository (~/.cache/viking-engine/hosts/ComfyUI-0.33.0, or
# $VIKING_HOSTS; `python3 scripts/unpack_host.py where` says where and how to get it), run by its
# Python 3.12 venv .comfy/venv-0.33, which setup_env.sh makes:
#
#     bash scripts/run_comfy.sh                  # ComfyUI 0.3.75
#     bash scripts/run_comfy.sh --comfy 0.33     # ComfyUI 0.33
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh all
exec .venv/bin/python scripts/run_comfy.py "$@"

#!/usr/bin/env bash
# The main job: installs what is needed (scripts/setup_env.sh), then starts a real ComfyUI with
# Viking Engine, runs the example workflow and prints Viking's status. Arguments go to
# scripts/run_comfy.py (--once to stop after the status, --gpu on a CUDA machine, --port N).
#
# ComfyUI version: 0.3.75 by default; `--comfy 0.33` runs ComfyUI 0.33 instead (its tree
# .comfy/ComfyUI-0.33 and Python 3.12 venv .comfy/venv-0.33, both made by setup_env.sh):
#
#     bash scripts/run_comfy.sh                  # ComfyUI 0.3.75
#     bash scripts/run_comfy.sh --comfy 0.33     # ComfyUI 0.33
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh all
exec .venv/bin/python scripts/run_comfy.py "$@"

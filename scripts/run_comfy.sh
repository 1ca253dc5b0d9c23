#!/usr/bin/env bash
# The main job: installs what is needed (scripts/setup_env.sh), then starts a real ComfyUI with
# Viking Engine, runs the example workflow and prints Viking's status. Arguments go to
# scripts/run_comfy.py (--once to stop after the status, --gpu on a CUDA machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh all
exec .venv/bin/python scripts/run_comfy.py "$@"

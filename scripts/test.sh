#!/usr/bin/env bash
# Runs every test: the Rust unit and property tests, then pytest on the built module and on a
# real ComfyUI server. Installs what it needs first (scripts/setup_env.sh; idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh all
echo "[test] cargo test"
cargo test --no-default-features --quiet
echo "[test] pytest"
.venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# Runs every test: the Rust unit and property tests, then pytest on the built module and on a
# real ComfyUI server. Installs what it needs first (scripts/setup_env.sh; idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh all
echo "[test] cargo test"
cargo test --no-default-features --quiet
# Fuzzing: the planner, the budget and the /proc/self/maps parser under many more property-test
# cases, bounded in time.
echo "[test] property-test fuzz run (VIKING_FUZZ_CASES=200000, at most 300 s)"
VIKING_FUZZ_CASES=200000 timeout 300 cargo test --no-default-features --release --quiet -- prop parser plan_invariants a_model_fills spans_agree budget_never
if command -v x86_64-w64-mingw32-gcc >/dev/null && command -v wine >/dev/null; then
    bash scripts/windows_check.sh
else
    echo "[test] Windows build skipped: no MinGW or Wine here (scripts/setup_env.sh installs them as root)"
fi
echo "[test] pytest"
.venv/bin/python -m pytest "$@"

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
# As a container without CAP_IPC_LOCK (Docker's default) or a normal user runs it: the engine
# tests again with the capability dropped and an 8 MiB locked-memory limit (those that lock
# more skip with the reason; the lock-limit test runs).
if [[ $EUID -eq 0 ]] && command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
    echo "[test] cargo test engine:: without CAP_IPC_LOCK, ulimit -l 8 MiB"
    prlimit --memlock=8388608:8388608 setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \
        cargo test --no-default-features --quiet engine:: -- --nocapture
else
    echo "[test] engine tests under a lock limit skipped: needs root with setpriv and prlimit (util-linux)"
fi
echo "[test] property-test fuzz run (VIKING_FUZZ_CASES=200000, at most 300 s)"
VIKING_FUZZ_CASES=200000 timeout 300 cargo test --no-default-features --release --quiet -- prop one_pass parser plan_invariants a_model_fills spans_agree budget_never
if command -v x86_64-w64-mingw32-gcc >/dev/null && command -v wine >/dev/null; then
    bash scripts/windows_check.sh
else
    echo "[test] Windows build skipped: no MinGW or Wine here (scripts/setup_env.sh installs them as root)"
fi
echo "[test] pytest"
.venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# Runs every test: the Rust unit and property tests, then pytest on the built module and on a
# real ComfyUI server. Installs what it needs first (scripts/setup_env.sh; idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh all
# Every unsafe block says why it is sound: clippy's undocumented_unsafe_blocks, denied (also set
# in Cargo.toml), with and without the pyo3 bindings and for the Windows target.
if cargo clippy --version >/dev/null 2>&1; then
    echo "[test] cargo clippy -D clippy::undocumented_unsafe_blocks"
    cargo clippy --no-default-features --all-targets --quiet -- -D clippy::undocumented_unsafe_blocks
    cargo clippy --all-targets --quiet -- -D clippy::undocumented_unsafe_blocks
    if rustup target list --installed 2>/dev/null | grep -qx x86_64-pc-windows-gnu; then
        cargo clippy --no-default-features --all-targets --target x86_64-pc-windows-gnu --quiet -- -D clippy::undocumented_unsafe_blocks
    else
        echo "[test] clippy for Windows skipped: no x86_64-pc-windows-gnu target (rustup target add x86_64-pc-windows-gnu)"
    fi
else
    echo "[test] cargo clippy skipped: clippy is not installed (rustup component add clippy)"
fi
# Runs a `cargo test` command and counts its tests as pytest's per-host lines do: those that ran
# and those that skipped. A test that cannot run writes `SKIP <name>: <reason>` to stderr, past
# the harness's capture (src/engine/tests.rs), and passes; it is counted here, not as run.
rust_tests() {   # LABEL COMMAND...
    local label=$1 log passed skipped
    shift
    log=$(mktemp)
    "$@" 2>&1 | tee "$log"
    passed=$(grep -o '[0-9]* passed' "$log" | awk '{n += $1} END {print n + 0}')
    skipped=$(grep -o 'SKIP [A-Za-z0-9_]*:' "$log" | wc -l)
    rm -f "$log"
    echo "rust $label: $((passed - skipped)) ran, $skipped skipped"
}
echo "[test] cargo test"
rust_tests "cargo test" cargo test --no-default-features --quiet
# As a container without CAP_IPC_LOCK (Docker's default) or a normal user runs it: the engine
# tests again with the capability dropped and an 8 MiB locked-memory limit (those that lock
# more skip with the reason; the lock-limit test runs).
if [[ $EUID -eq 0 ]] && command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
    echo "[test] cargo test engine:: without CAP_IPC_LOCK, ulimit -l 8 MiB"
    rust_tests "engine tests under an 8 MiB lock limit" \
        prlimit --memlock=8388608:8388608 setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \
        cargo test --no-default-features --quiet engine::
else
    echo "[test] engine tests under a lock limit skipped: needs root with setpriv and prlimit (util-linux)"
fi
# Fuzzing: the planner, the budget and the /proc/self/maps parser under many more property-test
# cases, bounded in time.
echo "[test] property-test fuzz run (VIKING_FUZZ_CASES=200000, at most 300 s)"
VIKING_FUZZ_CASES=200000 timeout 300 cargo test --no-default-features --release --quiet -- prop one_pass parser plan_invariants a_model_fills spans_agree budget_never
if command -v x86_64-w64-mingw32-gcc >/dev/null && command -v wine >/dev/null; then
    bash scripts/windows_check.sh
else
    echo "[test] Windows build skipped: no MinGW or Wine here (scripts/setup_env.sh installs them as root)"
fi
echo "[test] pytest"
.venv/bin/python -m pytest "$@"

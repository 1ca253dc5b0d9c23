#!/usr/bin/env bash
# Every CPU figure the docs quote, measured again on this Linux machine (no GPU needed; root for
# the swap, container and page-lock benches), stamped with this checkout's commit into
# bench/results/, and the docs rendered from them (scripts/figures.py).
#
#   bash scripts/cpu_figures.sh            # every step below, in order (about an hour on 2 cores)
#   bash scripts/cpu_figures.sh STEP...    # some of them
#
# STEPs and the result files they write:
#   swap        swap_cpu.json                     memory paged out between two runs (swap file, zram)
#   coldstart   cpu_cold_start.json (+ .bench)    --cpu first, warm and after-pressure prompts
#   container   container_residency_cpu.json      0.33 dynamic mode in a 4 GiB container
#   events      event_cost_cpu.json, static_event_cost_cpu.json, kept_objects_cpu.json
#   watcher     watcher_gc_cpu.json, watch_rate_cpu.json
#   stall       status_stall_cpu.json, status_stall_one_pass_cpu.json
#   benches     plan.json, maps_parse.json        cargo bench
#   firstprompt first_prompt_cpu.json             the first-prompt bench's check with --cpu
#   ramshort    ram_short_cpu.json                a machine short of RAM, 16 GB profile (about 25 minutes)
# Probes that compare with another commit (events, watcher, stall) take the baseline commit the
# current result file names, checked out beside (git worktree) and removed after.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

[[ -x .venv/bin/python && -x .comfy/venv-0.33/bin/python ]] || bash scripts/setup_env.sh all
VENV=.venv/bin/python
COMFY_PY=.comfy/venv-0.33/bin/python
COMFY033="$($VENV -c 'import sys; sys.path.insert(0, "tests"); import hosts; print(hosts.COMFY033_TREE)')"
COMMIT="$(git rev-parse --short HEAD)"
DIRTY=""
git diff --quiet HEAD -- src comfy_node bench tests benches Cargo.toml || DIRTY="--dirty"
DEVICE="this dev machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), no GPU, $(id -un)"
WORK="$(mktemp -d /tmp/cpu-figures.XXXXXX)"
BASELINES=()
cleanup() {
    for tree in "${BASELINES[@]}"; do git worktree remove --force "$tree" > /dev/null 2>&1 || true; done
    rm -rf "$WORK"
    git worktree prune
}
trap cleanup EXIT

# RESULT COMMAND...: run a bench writing $WORK/RESULT, then stamp it into bench/results/.
measure() {
    local result="$1"
    shift
    echo "[cpu_figures] $result: $*"
    "$@"
    for made in "$WORK/$result" "$WORK/${result%.json}.bench.json"; do
        [[ -e "$made" ]] || continue
        $VENV bench/stamp.py "$made" "bench/results/$(basename "$made")" "$COMMIT" "bash scripts/cpu_figures.sh $STEP ($*)" \
            --device "$DEVICE" $DIRTY
    done
}

# The baseline commit a result file compares with, checked out beside this one.
baseline_of() {  # RESULT_FILE -> prints the worktree's path
    local commit tree
    commit="$($VENV -c "import json, sys; print(json.load(open(sys.argv[1]))['baseline_commit'])" "bench/results/$1")"
    tree="$WORK/baseline-$commit"
    [[ -d "$tree" ]] || { git worktree add --detach "$tree" "$commit" > /dev/null; BASELINES+=("$tree"); }
    echo "$tree"
}

step_swap() { measure swap_cpu.json $VENV tests/swap_pressure.py "$WORK/swap_cpu.json"; }
step_coldstart() { measure cpu_cold_start.json $COMFY_PY bench/cpu_cold_start.py "$WORK/cpu_cold_start.json" --depth 2 --rounds 3; }
step_container() {
    measure container_residency_cpu.json $COMFY_PY tests/container_check.py "$COMFY033" "$WORK/container_residency_cpu.json" --reps 5
}
step_events() {
    measure event_cost_cpu.json $COMFY_PY bench/probes/event_cost.py "$COMFY033" "$WORK/event_cost_cpu.json"
    local base
    base="$(baseline_of static_event_cost_cpu.json)"
    measure static_event_cost_cpu.json $COMFY_PY bench/probes/static_event_cost.py "$COMFY033" "$WORK/static_event_cost_cpu.json" \
        --depth 2 --baseline "$base" --baseline-commit "$(git -C "$base" rev-parse --short HEAD)"
    base="$(baseline_of kept_objects_cpu.json)"
    measure kept_objects_cpu.json $COMFY_PY bench/probes/kept_objects.py "$COMFY033" "$WORK/kept_objects_cpu.json" \
        --depth 8 --baseline "$base" --baseline-commit "$(git -C "$base" rev-parse --short HEAD)"
}
step_watcher() {
    local base
    base="$(baseline_of watcher_gc_cpu.json)"
    measure watcher_gc_cpu.json $VENV bench/probes/watcher_gc.py "$WORK/watcher_gc_cpu.json" \
        --baseline "$base" --baseline-commit "$(git -C "$base" rev-parse --short HEAD)"
    measure watch_rate_cpu.json $VENV bench/probes/watch_rate.py "$WORK/watch_rate_cpu.json"
}
step_stall() {
    local name base site
    for name in status_stall_cpu.json status_stall_one_pass_cpu.json; do
        base="$(baseline_of "$name")"
        site="$base/.site"
        # The baseline's native module, built from its own source.
        [[ -d "$site" ]] || { (cd "$base" && "$ROOT/.venv/bin/maturin" build --release -o "$base/.wheel" --quiet) \
                                && $VENV -m pip install -q --no-deps --target "$site" "$base"/.wheel/*.whl; }
        measure "$name" $VENV bench/status_stall.py "$WORK/$name" --gib 16 --seconds 8 --baseline-site "$site" \
            --baseline-commit "$(git -C "$base" rev-parse --short HEAD)"
    done
}
step_benches() {
    # The benches write bench/results/ themselves, with the commit and whether the tree was clean.
    echo "[cpu_figures] plan.json, maps_parse.json: cargo bench"
    cargo bench --no-default-features --quiet --bench plan
    [[ -e benches/maps.rs ]] && cargo bench --no-default-features --quiet --bench maps
}
step_firstprompt() { measure first_prompt_cpu.json $VENV bench/first_prompt.py "$WORK/first_prompt_cpu.json" --cpu; }
step_ramshort() {
    if [[ ! -e bench/ram_short.py ]]; then echo "[cpu_figures] ramshort: bench/ram_short.py is not here yet, skipped"; return 0; fi
    measure ram_short_cpu.json $VENV bench/ram_short.py --profile 16gb --out "$WORK/ram_short_cpu.json"
}

ALL_STEPS=(swap coldstart container events watcher stall benches firstprompt ramshort)
STEPS=("${ALL_STEPS[@]}")
(( $# )) && STEPS=("$@")
for STEP in "${STEPS[@]}"; do
    declare -F "step_$STEP" > /dev/null || { echo "usage: $0 [$(IFS='|'; echo "${ALL_STEPS[*]}")]..." >&2; exit 2; }
done
for STEP in "${STEPS[@]}"; do
    started=$SECONDS
    "step_$STEP"
    echo "[cpu_figures] $STEP: $((SECONDS - started)) s"
done
$VENV scripts/figures.py render

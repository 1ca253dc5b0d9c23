#!/usr/bin/env bash
# The GPU checks, on the GPU machine (no network, no Rust toolchain: see the device notes in
# README.md).
#
# Every figure the docs quote, measured again: `bash scripts/gpu_check.sh all` lists the calls
# (each under ten minutes of the machine), `all N` runs call N there, and here
# `bash scripts/gpu_check.sh collect DIR N` stamps the files call N brought back with this
# checkout's commit, puts them in bench/results/ and renders the docs (scripts/figures.py).
#
# What it needs is carried in folders under .gpu/ (git-ignored), made here by
#   bash scripts/gpu_check.sh carry      # wheels for CPython 3.12 + the ComfyUI trees + this
#                                        # project's wheel, split into .gpu/c1 and .gpu/c2 (each
#                                        # under the 64 MiB a call may carry)
# and on the GPU machine, in one call per carried folder (the second within 30 s of the first,
# while the machine is warm and /tmp/site is still there):
#   bash scripts/gpu_check.sh install .gpu/c1 [PART...]
#   bash scripts/gpu_check.sh install .gpu/c2 [PART...]
#   bash scripts/gpu_check.sh parts PART...     (later calls on the same warm machine)
# PARTs, each writing its result files to $OUT (bench/results/ names):
#   tests       the GPU tests of the suite (native CUDA path, pressure release of CUDA pins,
#               pinned home and prefetch through ComfyUI's model management)
#   platforms   --cpu beside a GPU (no CUDA context, the OS lock) and the lock limit without CAP_IPC_LOCK
#   servers375  a real ComfyUI 0.3.75 server on the GPU (tests/test_gpu_server.py); servers033 0.33
#               (--disable-dynamic-vram); servers033dyn 0.33 in its default dynamic VRAM mode
#   home cap perf   the benches whose figures the README quotes, re-measured at this commit
#   dynamic     ComfyUI 0.33's dynamic VRAM mode alone and with Viking (bench/gpu_dynamic.py)
#   fp8 cquant gguf  the dynamic bench's modes (alone, Pin Model, engine, static alone and with the node) on
#               a Flux-shaped fp8-scaled model / the same in comfy-kitchen's comfy_quant layout / a Q8_0
#               GGUF one through ComfyUI-GGUF, 4 GiB of VRAM free
#   fastdisk    the same with ComfyUI's --fast-disk (steps read the file's pages), engine mode too
#   two         two models taking turns in each prompt, --fast-disk and default
#   rounds      the --fast-disk two-model modes, alone and with the nodes, three fresh servers
#               each, interleaved (one server per mode is as noisy as the differences)
#   rounds1     the same for one model in ComfyUI's default dynamic mode
#   rounds2     the same for two models in ComfyUI's default dynamic mode
#   roundsfp8   the same for one fp8-scaled model (part fp8's model and VRAM), default dynamic mode
#   roundscquant roundsgguf   the same for the comfy_quant and GGUF models of parts cquant and gguf
#   coldfp8     the fp8-scaled model, three servers each: alone, Pin Model, the Pin Model with
#               file_residency off, a clone node, engine mode
#   staticfp8   the fp8-scaled model in 0.33 static mode, alone and with the Pin Model, three servers
#               each, seconds per node (bench/probes/node_times.py)
#   staticgc    the same as staticfp8, with where each server's garbage collections ran, prompt by
#               prompt, and each look of Viking's gate watcher (bench/probes/gc_times.py: the cold
#               start's 0.25 s, the warm prompt's 7 ms)
#   staticgcslow  staticgc with the watcher looking every 0.5 s while held-back pins wait (0.02 s in Viking)
#   staticsplit the static cold start split: alone, Pin Model, the pack with no node, a clone as an
#               output node (bench/probes/node_times.py)
#   statusstall what a status read costs the execution thread with 24 GiB pinned (bench/status_stall.py;
#               this machine has the RAM the dev machine lacks)
#   staticvram  where the VRAM goes in the static cross-check (bench/probes/static_vram.py):
#               0.33 static alone and with the Pin Model, as is, prefetch off, --disable-cuda-malloc
#   staticorder the same, as is, after two dynamic-mode servers with Viking (as part dynamic runs it)
#   staticbreak where Viking's event time goes in 0.33 static mode while ComfyUI moves layers of the
#               fp8-scaled model between VRAM and RAM (bench/probes/static_event_breakdown.py)
#   twocold     per-node times of every prompt, two models in the default dynamic mode: alone, the
#               Pin Model (output nodes), the Pin Model as plain nodes (as before), a clone node,
#               the clone as an output node, engine mode (bench/probes/node_times.py; the cold
#               start that was 1.13x with the Pin Model as a plain node)
#   firstprompt the first prompt after a load, warm prompts and the prompt after a /free with the
#               Pin nodes and with the status node, beside two servers of ComfyUI alone: SD1.5-shaped
#               fp16, fp8-scaled and GGUF, 0.33 dynamic and static and 0.3.75 (bench/first_prompt.py)
#   ramshort    a machine short of RAM: cgroup, swap file, a browser-like neighbour; 0.33 dynamic and
#               static and 0.3.75, alone, Pin Model, engine mode (bench/ram_short.py --gpu)
#   zerocopy    Pin CLIP's zero-copy embeddings: mapped-view and real-server GPU tests, then
#               bench/zero_copy.py (encoder VRAM, encode time, a prompt in short VRAM; bit-identical)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# The hosts folder on the GPU machine: outside its copy of the repository (tests/hosts.py).
[[ "${1:-}" == carry ]] || export VIKING_HOSTS="${VIKING_HOSTS:-/tmp/viking-hosts}"
OUT="${OUT:-/tmp/viking-gpu-out}"
mkdir -p "$OUT"

carry() {
    local platforms="--platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
    local get="python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms"
    rm -rf .gpu/c1 .gpu/c2 && mkdir -p .gpu/c1 .gpu/c2
    # c1: what ComfyUI 0.3.75 needs beyond the machine's image, and our wheel; c2: what 0.33 adds
    # (comfy-kitchen alone is 56 MB).
    $get -d .gpu/c1 torchsde trampoline alembic Mako SQLAlchemy greenlet kornia kornia_rs spandrel pydantic pydantic_core \
        pydantic-settings python-dotenv annotated-types typing-inspection av
    $get -d .gpu/c2 comfy-kitchen==0.2.31 comfy-aimdo==0.4.13 blake3 simpleeval
    .venv/bin/maturin build --release -o .gpu/c1 --quiet
    # The trees without what a server on the API never reads (API nodes, blueprints, tests,
    # tokenizer data of text encoders the tests do not use): the calls carry at most 64 MiB.
    local skip=(--exclude=__pycache__ --exclude='*/comfy_api_nodes' --exclude='*/blueprints' --exclude='*/tests-unit'
                --exclude='*/tests' --exclude='*/script_examples' --exclude='*.md' --exclude='*/text_encoders/*/*.json'
                --exclude='*/text_encoders/*/*.model' --exclude='*/text_encoders/*/*.txt' --exclude='*/text_encoders/*/*.gz'
                --exclude='*/text_encoders/*/*.tiktoken')
    tar czf .gpu/c1/comfy-0.3.75.tgz "${skip[@]}" -C .comfy ComfyUI
    # The hosts (ComfyUI 0.33, ComfyUI-GGUF) from the hosts folder outside the repository; they
    # travel in the ignored .gpu/ and are unpacked outside the machine's copy of the repository.
    local hosts033 hostgguf
    hosts033="$(.venv/bin/python -c 'import sys; sys.path.insert(0, "tests"); import hosts; print(hosts.COMFY033_TREE)')"
    hostgguf="$(.venv/bin/python -c 'import sys; sys.path.insert(0, "tests"); import hosts; print(hosts.GGUF_PACK)')"
    tar czf .gpu/c2/host-ComfyUI-0.33.0.tgz "${skip[@]}" -C "$(dirname "$hosts033")" "$(basename "$hosts033")" \
        --transform "s|^$(basename "$hosts033")|ComfyUI-0.33.0|"
    tar czf .gpu/c2/host-ComfyUI-GGUF.tgz --exclude=__pycache__ -C "$(dirname "$hostgguf")" "$(basename "$hostgguf")" \
        --transform "s|^$(basename "$hostgguf")|ComfyUI-GGUF|"
    $get -d .gpu/c2 gguf
    du -sh .gpu/c1 .gpu/c2
}

install() {
    local from="$1"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$from"/*.whl
    mkdir -p .comfy
    for tree in "$from"/comfy-*.tgz; do [[ -e "$tree" ]] || continue; tar xzf "$tree" -C .comfy; done
    mkdir -p "$VIKING_HOSTS"
    for tree in "$from"/host-*.tgz; do [[ -e "$tree" ]] || continue; tar xzf "$tree" -C "$VIKING_HOSTS"; done
    # The installs tests/comfy_server.py expects, run by this machine's python3 (PYTHONPATH above).
    # (A wrapper, not a symlink: the machine's python3 is itself a venv's, found by its path.)
    local python
    python="$(command -v python3)"
    # Where the GPU sits among the host's CPUs and memory (a server's pinned buffers on the far
    # NUMA node copy slower): kept beside the results, read when two runs disagree.
    { nvidia-smi topo -m; lscpu | grep -i numa; command -v numactl > /dev/null && numactl --hardware; } \
        > "$OUT/topology.txt" 2>&1 || true
    for venv in .venv .comfy/venv-0.33; do
        mkdir -p "$venv/bin" && rm -f "$venv/bin/python" && touch "$venv/.setup-stamp-gpu"
        printf '#!/bin/sh\nexec %s "$@"\n' "$python" > "$venv/bin/python" && chmod +x "$venv/bin/python"
    done
}

part_tests() {
    VIKING_GPU_RESULTS="$OUT" python3 -m pytest -q -s -p no:cacheprovider tests/test_native.py tests/test_reliability.py \
        tests/test_gpu_streaming.py -k "cuda or gpu or gigabytes" 2>&1 | tee "$OUT/tests.log" | tail -40
    # gpu_tests.json: pytest's counts and the figures the tests print, from the log.
    python3 - "$OUT/tests.log" "$OUT/gpu_tests.json" <<'PY'
import json, re, sys, time
log = open(sys.argv[1]).read()
summary = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed)", line) and " in " in line]
counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped)", summary[-1] if summary else "")}
printed = [line.strip() for line in log.splitlines() if line.strip().startswith("cuda")]
json.dump({"bench": "gpu_tests", "date": time.strftime("%Y-%m-%d"), "passed": counts.get("passed", 0),
           "failed": counts.get("failed", 0), "skipped": counts.get("skipped", 0), "printed": printed},
          open(sys.argv[2], "w"), indent=1)
PY
}

# --cpu on a machine with a GPU (OS lock, no CUDA context) and the locked-memory limit of a
# process without CAP_IPC_LOCK (CUDA pins not counted against it, the OS lock within it).
part_platforms() {
    VIKING_GPU_RESULTS="$OUT" python3 -m pytest -q -s -p no:cacheprovider tests/test_gpu_server.py -k "cpu_flag or lock_limit" 2>&1 \
        | tee "$OUT/platforms.log" | tail -25
}

# The server bench keeps a few lines of each traceback in its result file; the servers' whole
# logs stay in their temporary folders. Each traceback there, with the lines before it and
# through its exception, is kept beside the results: NAME_tracebacks.log.
server_part() {  # NAME PYTEST_FILTER
    local name="$1" since status=0
    since=$(mktemp)
    VIKING_GPU_RESULTS="$OUT" python3 -m pytest -q -p no:cacheprovider tests/test_gpu_server.py -k "$2" 2>&1 | tee "$OUT/$name.log" || status=$?
    find /tmp -maxdepth 2 -path '/tmp/gpu_server_*' -name 'comfy-*.log' -newer "$since" -print0 \
        | xargs -0 -r grep -H -B3 -A40 '^Traceback' > "$OUT/${name}_tracebacks.log" || true
    [[ -s "$OUT/${name}_tracebacks.log" ]] || rm -f "$OUT/${name}_tracebacks.log"
    rm -f "$since"
    return "$status"
}

part_servers375() { server_part servers375 "0.3.75 and not dynamic"; }
part_servers033() { server_part servers033 "not dynamic and 0.33"; }
part_servers033dyn() { server_part servers033dyn "dynamic and 0.33"; }

# Zero-copy token embeddings (issue 60): the mapped-view and real-server GPU tests, then the
# bench (a Llama 3.1 8B-shaped encoder's 1.05 GB table: VRAM, encode time, a prompt in short VRAM);
# The Rust test of a registration's device address runs from a test binary made here and carried
# gzipped in .gpu/rust (no Rust toolchain there): cargo test --no-default-features --no-run, then
# strip -o /tmp/t target/debug/deps/viking_engine-HASH && gzip -9c /tmp/t > .gpu/rust/viking_engine-test.gz
part_zerocopy() {
    for binary in .gpu/rust/viking_engine-*.gz; do
        [[ -e "$binary" ]] || continue
        gunzip -c "$binary" > /tmp/viking_engine-test && chmod +x /tmp/viking_engine-test
        /tmp/viking_engine-test --test-threads=1 a_cuda_registration a_pin_a_mapped_view 2>&1 | tee "$OUT/zero_copy_rust.log" | tail -5
    done
    VIKING_GPU_RESULTS="$OUT" python3 -m pytest -q -s -p no:cacheprovider tests/test_zero_copy.py -k "not cpu_server" 2>&1 \
        | tee "$OUT/zero_copy_tests.log" | tail -30
    python3 bench/zero_copy.py .comfy/ComfyUI "$OUT/zero_copy_gpu.json" 2>&1 | tail -40
}

part_home() {
    python3 tests/home_check.py .comfy/ComfyUI "$OUT/gpu_home_timing.json" --parts timing,alternate --reps 3 --switches 4 2>&1 | tail -20
}

part_cap() {
    python3 tests/vram_cap_check.py .comfy/ComfyUI "$OUT/gpu_vram_cap.json" --caps 4,12 --modes comfy,viking,comfy_same_peak --reps 3 2>&1 | tail -12
}

part_perf() {
    python3 bench/gpu_perf.py .comfy/ComfyUI "$OUT/gpu_perf.json" --depth 19 --vram-gib 12 --reps 3 2>&1 | tail -40
}

dynamic_bench() {  # RESULT_FILE MODES [ARGS...] (the whole log beside the result: a failed prompt's error is in it)
    python3 bench/gpu_dynamic.py "$OUT/$1" --depth "${DYNAMIC_DEPTH:-8}" --free-gib "${DYNAMIC_FREE_GIB:-6}" --modes "$2" "${@:3}" 2>&1 \
        | tee "$OUT/${1%.json}.log" | tail -30
}

# The benches hold all but N GiB of the VRAM free when they start: a server of the previous
# part that is still exiting would free its memory later and leave them more than N. In a
# container nvidia-smi may list no processes at all, so the device's used memory counts too.
gpu_idle() {
    command -v nvidia-smi > /dev/null || return 0
    local used
    for _ in $(seq 120); do
        used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1 || true)
        [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && [ "${used:-0}" -lt 2048 ] && return 0
        sleep 0.5
    done
    echo "[gpu_check] the GPU is not idle after 60 s: ${used} MiB used;" \
         "$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader)"
}

# ComfyUI alone runs first and again last (#2): the spread between two fresh servers of one mode.
part_dynamic() { dynamic_bench gpu_dynamic.json dynamic,dynamic_nodes,dynamic_clone,dynamic_engine,static,static_nodes,dynamic#2; }
# The weight formats users download, VRAM held to 4 GiB free: ComfyUI 0.33 alone and with Viking,
# dynamic and static.
FORMAT_MODES=dynamic,dynamic_nodes,dynamic_engine,static,static_nodes
part_fp8() { DYNAMIC_FREE_GIB=4 dynamic_bench gpu_dynamic_fp8_scaled.json "$FORMAT_MODES" --format fp8_scaled; }
part_cquant() { DYNAMIC_FREE_GIB=4 dynamic_bench gpu_dynamic_comfy_quant.json "$FORMAT_MODES" --format comfy_quant; }
part_gguf() { DYNAMIC_FREE_GIB=4 dynamic_bench gpu_dynamic_gguf.json "$FORMAT_MODES" --format gguf; }
part_fastdisk() { dynamic_bench gpu_dynamic_fastdisk.json dynamic_fastdisk,dynamic_fastdisk_nodes,dynamic_fastdisk_engine; }
part_two() {
    dynamic_bench gpu_dynamic_two.json dynamic_two,dynamic_two_nodes,dynamic_fastdisk_two,dynamic_fastdisk_two_nodes,dynamic_fastdisk_two_engine
}
# MODE... -> "A,B,B#2,A#2,A#3,B#3": ROUNDS (3) fresh servers per mode, interleaved, the order
# reversed every other round so that no mode always runs right after the same other one.
round_modes() {
    local modes="" suffix order
    for round in $(seq "${ROUNDS:-3}"); do
        suffix=$([ $round = 1 ] || echo "#$round")
        order=("$@")
        if (( round % 2 == 0 )); then
            order=()
            for (( i = $#; i >= 1; i-- )); do order+=("${!i}"); done
        fi
        for mode in "${order[@]}"; do modes+="${modes:+,}$mode$suffix"; done
    done
    echo "$modes"
}
rounds_bench() {  # RESULT_FILE MODE...: the dynamic bench over round_modes' servers
    local result="$1"
    shift
    dynamic_bench "$result" "$(round_modes "$@")" ${ROUNDS_ARGS:-}
}
part_rounds() { rounds_bench gpu_dynamic_rounds.json dynamic_fastdisk_two dynamic_fastdisk_two_nodes; }
part_rounds1() { rounds_bench gpu_dynamic_rounds_one.json dynamic dynamic_nodes; }
# fp8-scaled, VRAM held to 4 GiB free as part fp8 does: alone and with the Pin Model, three servers each.
part_roundsfp8() {
    DYNAMIC_FREE_GIB=4 ROUNDS_ARGS="--format fp8_scaled" rounds_bench gpu_dynamic_rounds_fp8_scaled.json dynamic dynamic_nodes
}
# The same for the comfy_quant and GGUF models of parts cquant and gguf: a cold start with Viking
# against ComfyUI alone, told apart from the spread between fresh servers.
part_roundscquant() {
    DYNAMIC_FREE_GIB=4 ROUNDS_ARGS="--format comfy_quant" rounds_bench gpu_dynamic_rounds_comfy_quant.json dynamic dynamic_nodes
}
part_roundsgguf() {
    DYNAMIC_FREE_GIB=4 ROUNDS_ARGS="--format gguf" rounds_bench gpu_dynamic_rounds_gguf.json dynamic dynamic_nodes
}
# Where the fp8-scaled cold start's time goes with the Pin Model: three servers each of alone,
# the Pin Model (file_residency on and off), a clone node with no Viking (what any node that
# hands the sampler a clone costs) and engine mode (Viking with no node); through the node-times
# probe, so each prompt has its seconds per node and ComfyUI's load lines (the bench's own file
# beside it: gpu_dynamic_cold_fp8_scaled.bench.json).
part_coldfp8() {
    python3 bench/probes/node_times.py "$OUT/gpu_dynamic_cold_fp8_scaled.json" --format fp8_scaled \
        --modes "$(round_modes dynamic dynamic_nodes dynamic_nofile_nodes dynamic_clone dynamic_engine)" \
        --depth "${DYNAMIC_DEPTH:-8}" --free-gib 4 2>&1 | tee "$OUT/gpu_dynamic_cold_fp8_scaled.log" | tail -20
}
# 0.33 static mode (--disable-dynamic-vram), the fp8-scaled model: alone and with the Pin Model,
# three servers each, with each prompt's seconds per node (one server each gave the Pin Model's
# cold start 1.13x at f969328 and 1.17x at c4b002b; comfy_quant 0.99x and 1.02x).
static_rounds() {  # PROBE RESULT_NAME: dynamic alone once first (the latents' reference), then the static rounds
    python3 "bench/probes/$1" "$OUT/$2.json" --format fp8_scaled \
        --modes "dynamic,$(round_modes static static_nodes)" \
        --depth "${DYNAMIC_DEPTH:-8}" --free-gib 4 2>&1 | tee "$OUT/$2.log" | tail -12
}
part_staticfp8() { static_rounds node_times.py gpu_probe_static_fp8_node_times; }
# The same modes with each garbage collection of the servers placed in its prompt (bench/probes/gc_times.py).
part_staticgc() { static_rounds gc_times.py gpu_probe_static_fp8_gc; }
# Where the static-mode cold start's extra time comes from: alone, the Pin Model, the pack
# installed with no node, and a plain clone as an output node (the Pin Model is one, which makes
# ComfyUI run the loader first); two servers each, the second round in reverse order.
part_staticsplit() {
    python3 bench/probes/node_times.py "$OUT/gpu_probe_static_fp8_split.json" --format fp8_scaled \
        --modes "dynamic,static,static_nodes,static#installed,static_clone#output,static_clone#2#output,static#2#installed,static_nodes#2,static#2" \
        --depth "${DYNAMIC_DEPTH:-8}" --free-gib 4 2>&1 | tee "$OUT/gpu_probe_static_fp8_split.log" | tail -12
}
part_staticgcslow() { VIKING_PROBE_AFTER_PROMPT_WATCH_SECONDS=0.5 static_rounds gc_times.py gpu_probe_static_fp8_gc_slow_watch; }
part_rounds2() { rounds_bench gpu_dynamic_rounds_two_default.json dynamic_two dynamic_two_nodes; }
static_probe() {  # RESULT_FILE ARGS...
    local result="$1"
    shift
    python3 bench/probes/static_vram.py "$OUT/$result" --depth "${DYNAMIC_DEPTH:-8}" --free-gib "${DYNAMIC_FREE_GIB:-6}" "$@" 2>&1 \
        | tee "$OUT/${result%.json}.log" | grep -v '^static' | tail -30
}
part_staticvram() { static_probe gpu_probe_static_vram.json; }
# As part dynamic runs it: after two dynamic-mode servers with Viking.
part_staticorder() {
    static_probe gpu_probe_static_vram_order.json --variants default --modes dynamic_nodes,dynamic_engine,static,static_nodes
}

part_firstprompt() {
    python3 bench/first_prompt.py "$OUT/first_prompt_gpu.json" --free-gib 4 2>&1 | tee "$OUT/first_prompt_gpu.log" | tail -30
}

part_statusstall() {
    python3 bench/status_stall.py "$OUT/status_stall_24gib.json" --gib 24 --seconds 8 2>&1 | tail -12
}

part_staticbreak() {
    python3 bench/probes/static_event_breakdown.py "$VIKING_HOSTS/ComfyUI-0.33.0" "$OUT/gpu_probe_static_event_breakdown.json" \
        --depth "${DYNAMIC_DEPTH:-8}" --free-gib 4 2>&1 | tail -16
}

part_twocold() {
    python3 bench/probes/node_times.py "$OUT/gpu_probe_node_times.json" --depth "${DYNAMIC_DEPTH:-8}" \
        --free-gib "${DYNAMIC_FREE_GIB:-6}" 2>&1 | tee "$OUT/gpu_probe_node_times.log" | tail -12
}

# A machine short of RAM (issue 61): a memory cgroup scaled from a 16 GB machine, a swap file, a
# browser-like neighbour; ComfyUI 0.33 dynamic, 0.33 --disable-dynamic-vram and 0.3.75 on the GPU,
# each alone, with the Pin Model and in engine mode; VRAM held to 1 GiB free (bench/ram_short.py).
part_ramshort() {
    python3 bench/ram_short.py --gpu --profile "${RAM_SHORT_PROFILE:-16gb}" --vram-free-gib "${RAM_SHORT_FREE_GIB:-1}" \
        --out "$OUT/ram_short_gpu.json" 2>&1 | tee "$OUT/ram_short_gpu.log" | tail -30
}

# The calls of `all`: each under ten minutes of the machine (the seconds are those of the last
# runs on an H100, or estimates from the servers each part starts). Calls 1 and 2 install what
# .gpu/c1 and .gpu/c2 carry; the later ones need that machine still warm (else start again at 1).
ALL_CALLS=(
    "install .gpu/c1 servers375 home"            # ~140 + ~210 s
    "install .gpu/c2 tests platforms servers033"  # ~130 + ~90 + ~190 s
    "parts perf cap"                              # ~240 + ~200 s
    "parts servers033dyn fp8 cquant"              # ~190 + ~135 + ~135 s
    "parts gguf fastdisk statusstall"             # ~190 + ~150 + ~60 s
    "parts firstprompt"                           # 36 servers: ~480 s
    "parts dynamic staticbreak"                   # ~350 + ~120 s
    "parts rounds"                                # three servers per mode: ~300 s
    "parts rounds1"
    "parts rounds2"
    "parts roundsfp8"
    "parts roundscquant"
    "parts roundsgguf"
    "parts coldfp8"                               # 15 servers: ~450 s
    "parts staticfp8 staticgc"                    # ~185 + ~195 s
    "parts staticsplit"                           # ~270 s
    "parts staticvram"                            # ~300 s
    "parts twocold"                               # ~300 s
)
# Parts of benches other files add (first prompt, zero copy, a machine short of RAM): a call
# each, once the part exists.
for extra in firstprompt zerocopy ramshort; do
    declare -F "part_$extra" > /dev/null && ALL_CALLS+=("parts $extra")
done

all_calls() {
    if [[ -z "${1:-}" ]]; then
        echo "bash scripts/gpu_check.sh carry, here; then on the GPU machine, one call each (10 minutes at most):"
        for i in "${!ALL_CALLS[@]}"; do echo "  all $((i + 1)):  ${ALL_CALLS[$i]}"; done
        echo "and here, after each call: bash scripts/gpu_check.sh collect FILES_AT N"
        return 0
    fi
    local call="${ALL_CALLS[$(($1 - 1))]:-}"
    [[ -n "$call" ]] || { echo "[gpu_check] no call $1: there are ${#ALL_CALLS[@]}" >&2; return 2; }
    # The machine, as bench/stamp.py records it: "NVIDIA H100 80GB HBM3, driver 580.159.04, torch ..., CUDA 13".
    local gpu torch_version
    gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | sed 's/, /, driver /' || true)"
    torch_version="$(python3 -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")' 2>/dev/null || true)"
    echo "${gpu:-a GPU machine}, ${torch_version:-torch not found}" > "$OUT/device.txt"
    echo "$1: $call" > "$OUT/call.txt"
    # shellcheck disable=SC2086
    bash scripts/gpu_check.sh $call  # (the script cd'ed to the repository root)
}

# Here, on what a call brought back: each result file is stamped with this checkout's commit
# and the call that made it, and the docs' figures rendered again.
collect() {
    local from="$1" number="$2" commit device call dirty=""
    commit="$(git rev-parse --short HEAD)"
    git diff --quiet HEAD -- src comfy_node bench tests Cargo.toml || dirty="--dirty"
    device="$(cat "$from/device.txt" 2>/dev/null || echo "a GPU machine")"
    call="${ALL_CALLS[$((number - 1))]}"
    for result in "$from"/*.json; do
        [[ -e "$result" ]] || continue
        # Only the files the docs' figures come from (scripts/figures.py declares them).
        if ! .venv/bin/python -c 'import sys; sys.path.insert(0, "scripts"); import figures; sys.exit(sys.argv[1] not in figures.BENCHMARKS)' \
                "$(basename "$result")"; then
            echo "[gpu_check] $(basename "$result"): not declared in scripts/figures.py, left in $from"
            continue
        fi
        .venv/bin/python bench/stamp.py "$result" "bench/results/$(basename "$result")" "$commit" \
            "bash scripts/gpu_check.sh all $number ($call)" --device "$device" $dirty
    done
    .venv/bin/python scripts/figures.py render
}

case "${1:-}" in
    carry) carry ;;
    all) all_calls "${2:-}" ;;
    collect) collect "$2" "$3" ;;
    install|parts)
        # parts: on a machine an earlier install left warm (/tmp/site, the trees, the hosts)
        if [[ "$1" == install ]]; then install "$2"; shift; fi
        # A machine lent afresh between two calls has none of the first folder: say so at once
        # rather than spend device time on parts that cannot start.
        if (( $# > 1 )) && ! python3 -c "import viking_native" 2> /dev/null; then
            echo "[gpu_check] this machine has no /tmp/site from .gpu/c1 (a fresh machine?): run install .gpu/c1 first" >&2
            exit 3
        fi
        for part in "${@:2}"; do
            gpu_idle
            started=$SECONDS
            "part_$part" || echo "[gpu_check] part $part failed"
            echo "[gpu_check] part $part: $((SECONDS - started)) s"
        done ;;
    *) echo "usage: $0 all [N] | collect DIR N | carry | install FOLDER [PART...] | parts PART...   PART: [tests|platforms|servers375|servers033|servers033dyn|home|cap|perf|dynamic|fp8|cquant|gguf|fastdisk|two|rounds|rounds1|rounds2|roundsfp8|roundscquant|roundsgguf|coldfp8|staticfp8|staticgc|statusstall|staticvram|staticorder|staticbreak|twocold|zerocopy|ramshort|firstprompt]..." >&2; exit 2 ;;
esac

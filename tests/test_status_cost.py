"""The Viking Memory Status node and the panel's route cost a prompt nothing they need not: no
page-table reads on ComfyUI's threads (the execution thread runs the node, the route's executor
answers the panel). Reading each pinned page's residency costs ~24 ms per GiB; the residency
figures come from a sampler thread instead (comfy_node/residency.py).

How it is seen, whatever the code does: the kernel counts the bytes each thread read
(/proc/PID/task/TID/io, rchar). Reading the page tables of N pinned pages reads 8 bytes a page
from /proc/self/pagemap. So, with the models pinned, a prompt that only runs the status node
(the Pin nodes come from ComfyUI's cache) and a GET /viking/status must leave every thread of
the server but the sampler well below that. A real ComfyUI server (0.3.75 and 0.33, --cpu)."""

import os
from pathlib import Path

import pytest

from comfy_server import CKPT_NAME, ComfyServer, cached_checkpoint, pin_node, prepare_base_dir, wait_for

REPO = Path(__file__).resolve().parent.parent
PAGEMAP_BYTES_PER_PAGE = 8


def graph() -> dict:
    """The checkpoint's three models pinned, and the status node after the model's pin."""
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CKPT_NAME}},
        "10": pin_node("Model", ["4", 0]),
        "11": pin_node("CLIP", ["4", 1]),
        "12": pin_node("VAE", ["4", 2]),
        "13": {"class_type": "VikingMemoryStatus", "inputs": {"after": ["10", 0]}},
    }


def thread_reads(pid: int) -> dict[int, int]:
    """Bytes each thread of `pid` has read so far (rchar: every read syscall, /proc files too)."""
    reads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/io") as io:
                reads[int(tid)] = next(int(line.split()[1]) for line in io if line.startswith("rchar:"))
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread ended meanwhile
    return reads


def reads_during(pid: int, action) -> dict[int, int]:
    before = thread_reads(pid)
    action()
    after = thread_reads(pid)
    return {tid: after[tid] - before.get(tid, 0) for tid in after}


@pytest.fixture(scope="module")
def server(comfy_version, tmp_path_factory):
    base = prepare_base_dir(tmp_path_factory.mktemp("status_cost"), checkpoint=cached_checkpoint(),
                            custom_nodes={"viking_engine": REPO})
    with ComfyServer(base, version=comfy_version) as srv:
        srv.run_prompt(graph())  # loads and pins the three models
        yield srv


def test_status_node_and_route_read_no_page_tables_on_comfyuis_threads(server):
    status = server.get("/viking/status")
    pinned = status["pinned_bytes"]
    assert pinned >= 256 << 20, f"too little pinned to tell page-table reads apart: {pinned} B"
    pagemap_bytes = pinned // 4096 * PAGEMAP_BYTES_PER_PAGE
    # A quarter of one read of every pinned page's entry: the rest of a status (/proc/meminfo,
    # the cgroup's files, /proc/self/status) and the HTTP requests read a few KiB.
    limit = pagemap_bytes // 4

    for attempt in range(2):  # the second prompt runs with the sampler started by the first
        entry = {}
        by_thread = reads_during(server.pid, lambda: entry.update(server.run_prompt(graph())))
        assert "13" not in server.cached_nodes(entry), "the status node came from the cache: it must run"
        sampler = server.get("/viking/status").get("residency", {}).get("sampler_thread")
        busiest = max((n, tid) for tid, n in by_thread.items() if tid != sampler)
        assert busiest[0] < limit, (f"prompt {attempt + 1}: thread {busiest[1]} of the server read {busiest[0]} B while the "
                                    f"status node ran ({pinned} B pinned: {pagemap_bytes} B of page-table entries); "
                                    f"the sampler is thread {sampler}")

    by_thread = reads_during(server.pid, lambda: server.get("/viking/status"))
    sampler = server.get("/viking/status")["residency"]["sampler_thread"]
    busiest = max((n, tid) for tid, n in by_thread.items() if tid != sampler)
    assert busiest[0] < limit, f"GET /viking/status: thread {busiest[1]} read {busiest[0]} B (sampler: {sampler})"


def test_the_sampler_serves_residency_figures_with_their_age(server):
    server.run_prompt(graph())
    # Asking for a status wakes the sampler; it samples once no prompt runs.
    assert wait_for(lambda: server.get("/viking/status")["residency"]["sampled_at"] is not None, timeout=30)
    status = server.get("/viking/status")
    residency = status["residency"]
    assert residency["sampler_thread"] in thread_reads(server.pid), residency
    assert 0 <= residency["age_seconds"] < 60, residency
    # On the CPU every weight of a pinned model sits in RAM: the sample says so.
    for owner in status["owners"]:
        if owner["pinned_bytes"]:
            assert owner["resident_bytes"] is not None and owner["resident_bytes"] >= owner["pinned_bytes"], owner
            assert owner["pinned_swapped_bytes"] == 0, owner
    assert "sampled" in status["text"], status["text"]
    # A figure read for the asker (?residency=now) is as fresh as it gets.
    now = server.get("/viking/status?residency=now")
    assert now["residency"]["age_seconds"] == 0.0
    assert all(o["resident_bytes"] is not None for o in now["owners"] if o["pinned_bytes"]), now["owners"]

"""The swap guard with the real OS: a temporary swap file, a real ComfyUI server with the
synthetic checkpoint parked in RAM, its memory paged out from outside with process_madvise.
Viking's pinned weights must stay in RAM; without Viking the weights go to swap. Skips, saying
why, where swap cannot be enabled (not root, or swapon refused)."""

import json
import os
import sys
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parent))
import swap_pressure  # noqa: E402


@pytest.fixture(scope="module")
def figures(comfy_version, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("swapon needs root: the swap-guard harness cannot run here")
    try:
        result = swap_pressure.measure(tmp_path_factory.mktemp("swap"), version=comfy_version)
    except swap_pressure.SwapUnavailable as reason:
        pytest.skip(f"no swap on this machine: {reason}")
    print("\n" + json.dumps(result["ratios"]))
    return {(row["swap_device"], row["scenario"]): row for row in result["scenarios"]}


DEVICES = ["swap file", "zram"]


@pytest.mark.parametrize("device", DEVICES)
def test_pinned_weights_never_reach_swap(figures, device):
    viking = figures[device, "viking"]
    assert viking["pinned_bytes"] > 300e6
    assert viking["pinned_weights_swapped_bytes_max"] == 0
    # The kernel refused to page out the locked mappings: at least every pinned byte.
    assert viking["pageout_refused_bytes_min"] >= viking["pinned_bytes"]


@pytest.mark.parametrize("device", DEVICES)
def test_unpinned_weights_do_go_to_swap(figures, device):
    plain, viking = figures[device, "unpinned"]["median"], figures[device, "viking"]
    # Without Viking the process lost its weights to swap on top of what it loses anyway,
    assert plain["process_swapped_bytes"] - viking["median"]["process_swapped_bytes"] >= 0.8 * viking["pinned_bytes"]
    # and the next run faulted them back in, page by page.
    extra_faults = plain["page_faults_during_next_run"] - viking["median"]["page_faults_during_next_run"]
    assert extra_faults * os.sysconf("SC_PAGE_SIZE") >= 0.2 * viking["pinned_bytes"]


def test_real_swap_ins_without_viking_only(figures):
    # zram evicts for real: the unpinned run reads its weights back from swap.
    plain, viking = figures["zram", "unpinned"]["median"], figures["zram", "viking"]["median"]
    assert plain["swapped_in_during_next_run_bytes"] - viking["swapped_in_during_next_run_bytes"] >= 0.2 * figures["zram", "viking"]["pinned_bytes"]


def test_swap_file_is_gone(figures):
    swap_file = Path(__file__).resolve().parent.parent / ".comfy" / "swapfile"
    assert not swap_file.exists()
    # Only this checkout's file: another checkout on the same kernel may be swapping to its own.
    assert not swap_pressure.is_active_swap(swap_file)

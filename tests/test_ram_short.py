"""The RAM-short machine of bench/ram_short.py (tests/ram_short_machine.py, tests/neighbour.py):
the scale rule, the schedule and the bar as pure logic; then the real thing at its smallest: a
memory cgroup with a limit below the neighbour's working set, a swap file it goes to, a burst, the
disk throttle, and the bench itself with one ComfyUI server and two prompts."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ram_short_machine as rsm  # noqa: E402
from memory_cgroup import Unavailable  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MIB = rsm.MIB


# ---- pure logic ---------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", sorted(rsm.PROFILES))
@pytest.mark.parametrize("model_set, base", [(1_860_000_000, 1_200 * MIB), (900_000_000, 3_000 * MIB), (40 << 30, 2 << 30)])
def test_the_model_set_fits_and_with_the_neighbour_does_not(profile, model_set, base):
    machine = rsm.scaled_machine(rsm.PROFILES[profile], model_set, base)
    assert machine.model_set_fits() and machine.neighbour_does_not_fit()
    assert machine.memory_limit_bytes % rsm.PAGE == 0 and machine.swap_bytes % MIB == 0
    # everything but the server's own runtime scales together
    scale = model_set / rsm.PROFILES[profile].models_bytes
    assert machine.hot_bytes == pytest.approx(scale * rsm.PROFILES[profile].hot_bytes, abs=rsm.PAGE)
    assert machine.memory_limit_bytes - base == pytest.approx(scale * rsm.PROFILES[profile].ram_bytes, abs=rsm.PAGE)


def test_model_set_is_held_mostly_as_fp32_on_the_cpu():
    assert rsm.model_set_bytes([100, 200], cpu=True) == 450
    assert rsm.model_set_bytes([100, 200], cpu=False) == 300


def test_the_schedule_has_every_kind_early_and_switches_both_ways():
    assert {kind for _, kind in rsm.schedule(6)} == set(rsm.KINDS)
    steps = rsm.schedule(14)
    assert len(steps) == 14 and steps[0] == ("base", "first")
    for (before, _), (model, kind) in zip(steps, steps[1:]):
        assert (kind == "after_switch") == (model != before), (before, model, kind)
    assert {("base", "after_switch"), ("refiner", "after_switch")} <= set(steps)


def _run(mode, seconds, swap_in=0, reads=0, oom=0, p95=10.0, psi_full=1000, killed=False):
    prompts = [dict(index=i, kind=kind, seconds=s, hash=f"h{i}") for i, (kind, s) in enumerate(seconds)]
    return dict(mode=mode, comfy=dict(version="0.33", vram_mode="cpu"), prompts=prompts, swap_in_bytes=swap_in,
                file_read_bytes=reads, oom_kills=oom, neighbour=dict(p95_ms=p95, killed=killed), psi_full_us=psi_full)


def test_the_bar_asks_for_2x_after_a_switch_only_where_alone_swaps_or_rereads():
    alone_kinds = [("first", 10.0), ("warm", 4.0), ("after_switch", 8.0), ("after_burst", 8.0)]
    faster = [("first", 10.0), ("warm", 4.0), ("after_switch", 5.0), ("after_burst", 3.0)]
    quiet_alone = _run("alone", alone_kinds)
    assert rsm.verdict(quiet_alone, _run("pin_model", faster), model_files_bytes=1000)["ok"]
    swapping_alone = _run("alone", alone_kinds, swap_in=64 * MIB)
    judged = rsm.verdict(swapping_alone, _run("pin_model", faster), model_files_bytes=1000)
    assert not judged["ok"] and judged["alone_swaps_or_rereads"]
    failed = [c["what"] for c in judged["checks"] if not c["ok"]]
    assert failed == ["after_switch prompt seconds / alone's"]  # 0.625x; after_burst's 0.375x clears 0.5
    rereading_alone = _run("alone", alone_kinds, reads=3000)
    assert rsm.verdict(rereading_alone, _run("engine", faster), model_files_bytes=1000)["alone_swaps_or_rereads"]


def test_the_bar_holds_each_mode_to_alone_on_time_oom_neighbour_and_stalls():
    alone = _run("alone", [("first", 10.0), ("warm", 4.0)])
    assert rsm.verdict(alone, _run("engine", [("first", 10.0), ("warm", 4.0)]), 1000)["ok"]
    for worse, what in ((dict(seconds=[("first", 10.0), ("warm", 4.5)]), "warm prompt seconds / alone's"),
                        (dict(oom=1), "OOM kills (cgroup's, with the neighbour's)"),
                        (dict(killed=True), "OOM kills (cgroup's, with the neighbour's)"),
                        (dict(p95=11.5), "neighbour p95 touch latency / alone's"),
                        (dict(psi_full=1001), "PSI full stall time / alone's")):
        run = _run("pin_model", **{"seconds": [("first", 10.0), ("warm", 4.0)], **worse})
        judged = rsm.verdict(alone, run, 1000)
        assert [c["what"] for c in judged["checks"] if not c["ok"]] == [what], worse
    assert rsm.verdict(alone, dict(_run("engine", [("first", 9.0)]), psi_full_us=None), 1000)["ok"] is False


def test_images_are_compared_per_comfyui_against_alone():
    runs = [_run("alone", [("first", 1.0), ("warm", 1.0)]), _run("pin_model", [("first", 1.0), ("warm", 1.0)])]
    assert rsm.hash_agreement(runs) == {"0.33 cpu": dict(identical=True, compared=2, differing=[])}
    runs[1]["prompts"][1]["hash"] = "other"
    assert rsm.hash_agreement(runs)["0.33 cpu"]["differing"] == [dict(mode="pin_model", prompt=1)]
    assert rsm.hash_agreement(runs[:1])["0.33 cpu"]["identical"] is None


# ---- the real machine -----------------------------------------------------------------------------
@pytest.fixture
def small_machine(tmp_path):
    """A 96 MiB cgroup with a 512 MiB swap file; the "models" are a 96 MiB file on the disk the
    repository is on, throttled to a hard disk's speed."""
    model = REPO / ".comfy" / f"ram_short_test_{os.getpid()}.bin"
    model.parent.mkdir(exist_ok=True)
    model.write_bytes(os.urandom(96 * MIB))
    os.sync()
    try:
        with rsm.RamShortMachine("viking_ram_short_test", tmp_path / "swap", 512 * MIB, "hdd", [model]) as machine:
            yield machine
    except Unavailable as why:
        pytest.skip(f"no RAM-short machine here: {why}")
    finally:
        model.unlink(missing_ok=True)


def test_the_neighbour_goes_to_swap_when_the_limit_is_below_its_working_set(small_machine, tmp_path):
    small_machine.set_limit(96 * MIB)
    before = small_machine.counters()
    neighbour = rsm.Neighbour(small_machine, hot_bytes=128 * MIB, burst_bytes=32 * MIB, record=tmp_path / "n.json",
                              burst_every="0")
    assert neighbour.pid in small_machine.pids()
    time.sleep(2)
    swapped = small_machine.sample()["swap_bytes"]
    burst_seconds = neighbour.burst()
    record = neighbour.stop()
    after = small_machine.counters()
    print(f"cgroup swap {swapped / MIB:.0f} MiB, neighbour {record}, counters {rsm.differences(before, after)}")
    assert swapped >= 24 * MIB, "128 MiB touched in a 96 MiB cgroup: the rest must sit in swap"
    assert rsm.differences(before, after)["swap_out_bytes"] >= 24 * MIB
    assert burst_seconds is not None and burst_seconds >= 1.0  # held 1 s, then freed
    assert record["killed"] is False and record["exit_code"] == 0
    assert record["passes"] >= 3 and record["major_faults"] > 0 and record["p95_ms"] >= record["p50_ms"] > 0
    assert [b["asked"] for b in record["bursts"]] == [True]
    assert after["oom_kills"] == before["oom_kills"]


def test_the_model_files_disk_is_throttled(small_machine):
    if small_machine.disk_read_limit is None:
        pytest.skip(f"no disk throttle here: {small_machine.disk_read_limit_reason}")
    model = small_machine.model_files[0]
    small_machine.drop_model_cache()
    began = time.monotonic()
    subprocess.run(small_machine.command(["cat", str(model)]), stdout=subprocess.DEVNULL, check=True)
    speed = model.stat().st_size / (time.monotonic() - began)
    print(f"read {model.stat().st_size / MIB:.0f} MiB at {speed / 1e6:.0f} MB/s (limit {small_machine.disk_read_limit / 1e6:.0f})")
    assert speed <= 1.15 * small_machine.disk_read_limit

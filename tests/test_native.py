"""The native module on real torch tensors and real mlock (the OS-lock backend: no GPU here).
The CUDA test at the end runs only where a GPU is (it says why it skips otherwise)."""

import json
import math
import time

import pytest
import torch

from comfy_node.weights import cpu_storage_ranges, module_tensors
from memory_probe import locked_bytes

import viking_native as vn

MIB = 1 << 20


@pytest.fixture(autouse=True)
def clean_engine():
    vn.configure(headroom_gib=0.0)
    yield
    vn.release_all()
    vn.configure()


def model(megabytes=64, layers=8):
    """A real torch model with `megabytes` of fp32 weights in `layers` Linear layers."""
    width = int(math.sqrt(megabytes * MIB / 4 / layers))
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def reconcile(owner, module, **kw):
    ranges, foreign = cpu_storage_ranges(module_tensors(module))
    return json.loads(vn.reconcile(owner, ranges, backend="os-lock", foreign=foreign, **kw)), ranges


def test_pins_a_models_weights_and_vmlck_follows():
    net = model()
    before = locked_bytes()
    report, ranges = reconcile(1, net, label="test model")
    total = sum(n for _, n, _ in ranges)
    assert report["wanted_bytes"] == total
    # Small bias vectors fall under the too-small threshold; the weights are pinned.
    assert report["pinned_bytes"] >= 0.99 * total
    assert locked_bytes() - before >= report["pinned_bytes"]
    status = json.loads(vn.status_json())
    owner = next(o for o in status["owners"] if o["owner"] == 1)
    assert owner["label"] == "test model" and owner["by_backend"] == {"os-lock": report["pinned_bytes"]}
    assert vn.release(1) == report["pinned_bytes"]
    assert locked_bytes() - before <= 8192  # back (at most the shared edge pages of neighbours)


def test_pinning_twice_pins_nothing_twice():
    net = model()
    first, _ = reconcile(1, net)
    locked = locked_bytes()
    second, _ = reconcile(1, net)
    assert second["newly_pinned_bytes"] == 0 and second["released_bytes"] == 0
    assert second["pinned_bytes"] == first["pinned_bytes"]
    assert locked_bytes() == locked
    # Another owner over the same storages (a clone of the model) gets nothing more.
    other, _ = reconcile(2, net)
    assert other["newly_pinned_bytes"] == 0
    assert {s["reason"] for s in other["skipped"]} >= {"pinned_for_another_model"}


def test_budget_below_model_pins_highest_priority_first():
    high, low = model(32), model(32)
    vn.configure(budget_gib=48 / 1024, headroom_gib=0.0)  # 48 MiB for 64 MiB of weights
    low_report, _ = reconcile(1, low, priority=0)
    high_report, _ = reconcile(2, high, priority=5)
    status = json.loads(vn.status_json())
    assert status["budget"]["bound_by"] == "user"
    assert status["pinned_bytes"] <= 48 * MIB
    # The high-priority model is pinned whole; the low one gave way and says so.
    assert high_report["pinned_bytes"] >= 0.99 * high_report["wanted_bytes"]
    assert high_report["evicted"] and high_report["evicted"][0][0] == 1
    low_again, _ = reconcile(1, low, priority=0)
    assert low_again["pinned_bytes"] <= 48 * MIB - high_report["pinned_bytes"]
    reasons = {s["reason"]: s["bytes"] for s in low_again["skipped"]}
    assert reasons["over_budget"] > 0


def test_weights_that_move_are_released():
    net = model(16, 2)
    reconcile(1, net)
    # ComfyUI replaces a weight's storage (load to GPU frees the CPU copy; unload allocates a
    # new one): the old storage's pin goes, the new one is pinned.
    old_ptr = net[0].weight.data_ptr()
    net[0].weight.data = net[0].weight.data.clone()
    report, _ = reconcile(1, net)
    moved = net[0].weight.nbytes
    assert report["released_bytes"] >= moved and report["newly_pinned_bytes"] >= moved
    assert net[0].weight.data_ptr() != old_ptr


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(budget_gib=-1.0), "budget_gib is -1"),
        (dict(budget_gib=float("nan")), "budget_gib is NaN"),
        (dict(budget_gib=1e12), "give a number of GiB from 0 \\(auto\\) to 1048576"),
        (dict(headroom_gib=float("nan")), "headroom_gib is NaN"),
        (dict(share=2.0), "share of RAM is 2"),
        (dict(device=99), "CUDA device 99 does not exist"),
        (dict(device=-1), "device numbers start at 0"),
    ],
)
def test_bad_configuration_is_a_clear_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vn.configure(**kwargs)


@pytest.mark.parametrize(
    "ranges, message",
    [
        ([(0, 4096, None)], "address is 0"),
        ([(4096 * 16, 0, None)], "length is 0"),
        ([(2**64 - 4096, 8192, None)], "runs past the end of the address space"),
        ([(-5, 4096, None)], "must be between 0 and 2\\*\\*64-1"),
        ([(4096, 4096)], "must be a tuple"),
        ([("x", 4096, None)], "must be an int"),
    ],
)
def test_bad_ranges_are_rejected_and_pin_nothing(ranges, message):
    net = model(8, 1)
    good, _ = cpu_storage_ranges(module_tensors(net))
    before = locked_bytes()
    with pytest.raises((ValueError, TypeError), match=message):
        vn.reconcile(1, good + ranges, backend="os-lock")
    assert locked_bytes() == before
    assert json.loads(vn.status_json())["registrations"] == 0


def test_unknown_backend_and_missing_cuda_are_clear():
    with pytest.raises(ValueError, match="use 'auto', 'cuda' or 'os-lock'"):
        vn.reconcile(1, [], backend="gpu")
    if vn.cuda_device_count() == 0:
        with pytest.raises(vn.BackendUnavailableError, match="cuda backend is unavailable"):
            vn.reconcile(1, [], backend="cuda")
        # auto falls back to the OS lock, and pins with it.
        net = model(8, 1)
        ranges, _ = cpu_storage_ranges(module_tensors(net))
        report = json.loads(vn.reconcile(1, ranges, backend="auto"))
        assert report["backend"] == "os-lock" and report["pinned_bytes"] >= 0.99 * report["wanted_bytes"] > 0, report
        vn.release(1)


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine: the CUDA path runs on the GPU machine")


def runtime_last_error():
    """cudaGetLastError() of the CUDA runtime PyTorch loaded (torch does not expose it)."""
    import ctypes

    with open("/proc/self/maps") as maps:
        path = next(line.split()[-1] for line in maps if "libcudart.so" in line)
    return ctypes.CDLL(path).cudaGetLastError()


@needs_gpu
def test_cuda_registration_of_gigabytes():
    # As in ComfyUI, PyTorch's CUDA is up (is_pinned() reports False before it is).
    torch.cuda.init()
    vn.configure(headroom_gib=0.0)
    gib = 1 << 30
    tensors = [torch.ones(256 * MIB // 2, dtype=torch.float16) for _ in range(16)]  # 4 GiB
    ranges, foreign = cpu_storage_ranges(tensors)
    assert foreign == []
    started = time.perf_counter()
    report = json.loads(vn.reconcile(7, ranges, backend="cuda"))
    pin_seconds = time.perf_counter() - started
    assert report["backend"] == "cuda" and report["pinned_bytes"] == 4 * gib, report
    assert all(t.is_pinned() for t in tensors)
    assert vn.device_pointer(ranges[0][0]) == ranges[0][0]  # UVA

    def bandwidth(sources):
        torch.cuda.synchronize()
        best = 0.0
        for _ in range(3):
            started = time.perf_counter()
            for source in sources:
                source.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            best = max(best, sum(s.nbytes for s in sources) / (time.perf_counter() - started))
        return best

    pinned_bw = bandwidth(tensors)
    pageable = [t.clone() for t in tensors]
    pageable_bw = bandwidth(pageable)
    print(f"\ncuda: pinned 4 GiB in {pin_seconds:.2f} s ({4 / pin_seconds:.1f} GiB/s); "
          f"H2D pinned {pinned_bw / 1e9:.1f} GB/s vs pageable {pageable_bw / 1e9:.1f} GB/s = {pinned_bw / pageable_bw:.1f}x")
    assert pinned_bw >= 5 * pageable_bw

    # A forced failure: memory someone else registered (runtime API), not declared foreign.
    extra = torch.ones(64 * MIB // 4)
    cudart = torch.cuda.cudart()
    assert int(cudart.cudaHostRegister(extra.data_ptr(), extra.nbytes, 0)) == 0
    failed = json.loads(vn.reconcile(8, cpu_storage_ranges([extra])[0], backend="cuda"))
    assert failed["failures"] and "712" in failed["failures"][0], failed
    assert failed["pinned_bytes"] == 0
    assert runtime_last_error() == 0  # nothing sticky left for PyTorch
    (extra.to("cuda") + 1).sum().item()  # the next PyTorch call works
    torch.cuda.synchronize()
    assert int(cudart.cudaHostUnregister(extra.data_ptr())) == 0

    assert vn.release_all() == 4 * gib
    assert json.loads(vn.status_json())["registrations"] == 0
    assert not any(t.is_pinned() for t in tensors)

    # PORTABLE only (ComfyUI's own flags): pinned and as fast, but no device mapping.
    vn.configure(headroom_gib=0.0, cuda_devicemap=False)
    try:
        report = json.loads(vn.reconcile(9, ranges, backend="cuda"))
        assert report["pinned_bytes"] == 4 * gib and all(t.is_pinned() for t in tensors), report
        portable_bw = bandwidth(tensors)
        print(f"cuda, PORTABLE only: H2D {portable_bw / 1e9:.1f} GB/s")
        assert portable_bw >= 0.9 * pinned_bw
        try:  # without DEVICEMAP the driver may or may not map it (UVA): either way, cleanly
            mapped = vn.device_pointer(ranges[0][0]) == ranges[0][0]
        except vn.VikingNativeError as error:
            mapped = str(error)
        print(f"cuda, PORTABLE only: device pointer -> {mapped}")
        assert runtime_last_error() == 0
        assert vn.release_all() == 4 * gib
    finally:
        vn.configure(cuda_devicemap=True)

"""The status's first line, for people: whether the models' data is safe from swap, and when
something was left out, what limits it and what to change (comfy_node/report.py)."""
from comfy_node.report import verdict


def status(owners, windows=False, mode="static", reason="limited by headroom: 4.0 GiB must stay free"):
    return {"owners": owners, "paging": {"commit_limit": 1 << 36 if windows else None},
            "budget": {"reason": reason}, "comfy": {"mode": mode, "pinned_bytes": 3 << 30}}


def owner(pinned, wanted, skipped=()):
    return {"pinned_bytes": pinned, "wanted_bytes": wanted,
            "skipped": [{"reason": r, "bytes": b} for r, b in skipped]}


def test_nothing_pinned_says_how_to_start():
    assert "Put a Viking Pin Model after a loader" in verdict(status([]))


def test_all_pinned_is_safe_from_swap_or_the_pagefile():
    assert verdict(status([owner(2 << 30, 2 << 30)])).endswith("2.0 GiB of your models' 2.0 GiB in RAM is page-locked: safe from swap.")
    assert "safe from the pagefile" in verdict(status([owner(1 << 30, 1 << 30)], windows=True))


def test_what_binds_and_what_to_change():
    text = verdict(status([owner(1 << 30, 3 << 30, [("over_budget", 2 << 30), ("too_small", 1 << 10)])]))
    assert "2.0 GiB left out: limited by headroom: 4.0 GiB must stay free" in text
    assert "lower the RAM headroom (Settings > Viking Engine > RAM headroom)" in text
    fixed = status([owner(1 << 30, 3 << 30, [("over_budget", 2 << 30)])])
    fixed["headroom_source"] = "VIKING_HEADROOM_GIB"  # a variable fixes it: the dialog cannot change it
    assert "lower the RAM headroom (VIKING_HEADROOM_GIB)" in verdict(fixed)
    text = verdict(status([owner(8 << 20, 3 << 30, [("lock_limit", 3 << 30)])]))
    assert "locked-memory limit (ulimit -l)" in text and "--ulimit memlock=-1" in text


def test_dynamic_mode_with_nothing_to_pin_says_what_viking_does_there():
    text = verdict(status([owner(0, 0)], mode="dynamic"))
    assert "dynamic VRAM mode stages the weights itself" in text and "3.0 GiB pinned by ComfyUI" in text

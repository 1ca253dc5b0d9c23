"""The status's budget line when the budget's room left is more than the RAM available: it says
why (the weights Viking pins already sit in RAM), where a reader would otherwise take it for a
promise of free memory (comfy_node/report.py)."""
from comfy_node.report import status_text

GIB = 1 << 30


def status(room_gib, available_gib):
    return {"owners": [], "version": "0", "pinned_bytes": 0, "registrations": 0,
            "budget": {"limit_bytes": int(room_gib * GIB), "room_bytes": int(room_gib * GIB),
                       "reason": "limited by headroom: 4.0 GiB must stay free"},
            "memory": {"available_ram": int(available_gib * GIB), "total_ram": 32 * GIB},
            "paging": {"swap_used": 0, "swap_total": 0}, "cuda": {"available": False, "reason": "no GPU"},
            "counters": {"registrations": 0, "releases": 0, "failures": 0}, "events": []}


def budget_line(text):
    return next(line for line in text.splitlines() if line.startswith("Budget:"))


def test_room_beyond_the_available_ram_is_explained():
    line = budget_line(status_text(status(room_gib=18.2, available_gib=16.9)))
    assert "room left 18.2 GiB (more than the available RAM: pinning weights that already sit in RAM takes no new memory)" in line


def test_room_within_the_available_ram_needs_no_word():
    assert budget_line(status_text(status(room_gib=8.0, available_gib=16.9))).endswith("; room left 8.0 GiB")

"""Readable text from the status (lifecycle.status()), for the status node, the route and the
log. Everything it prints comes from that one dict."""

from __future__ import annotations

import time


def _pressure_line(pressure: dict | None) -> str | None:
    """One line once the pressure governor gave pins back: "Memory pressure: gave back 3.1 GiB at
    12:04: the machine stalled 23% of the last 1.5 s", and whether they may be pinned again."""
    given = (pressure or {}).get("last_give_back")
    if not given:
        return None

    def clock(event):
        return time.strftime("%H:%M", time.localtime(event["unix_time"]))

    line = f"Memory pressure: gave back {human(given['bytes'])} at {clock(given)}: {given['reason']}"
    taken = pressure.get("last_take_back")
    if pressure.get("ceiling_bytes") is not None:
        line += f"; pins again after {pressure['hold_seconds']:.0f} s without stalls"
    elif taken and taken["unix_time"] >= given["unix_time"]:
        line += f"; pinning again since {clock(taken)}"
    return line


def human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


# What a person can change when weights were left unpinned for a reason (plan.rs SkipReason names).
ADVICE = {
    "over_budget": "raise the node's budget_gib, or lower the RAM headroom ({headroom}) if the machine can spare the RAM",
    "lock_limit": "raise the locked-memory limit: docker run --ulimit memlock=-1 (or --cap-add IPC_LOCK), "
                  "systemd LimitMEMLOCK=infinity",
}


def _sample_age(status: dict) -> str:
    """Where residency figures come from a sample taken earlier (residency.py), how long ago."""
    age = (status.get("residency") or {}).get("age_seconds")
    return f" (sampled {age:.0f} s ago)" if age else ""


def verdict(status: dict) -> str:
    """One line for people first: is the model data safe from swap, and if not, what binds and
    what to change."""
    swap = "the pagefile" if status["paging"].get("commit_limit") else "swap"
    owners = status["owners"]
    if not owners:
        return ("Viking Engine: no model pinned yet. Put a Viking Pin Model after a loader, or switch on engine mode "
                "(Settings > Viking Engine).")
    pinned = sum(o["pinned_bytes"] for o in owners)
    wanted = sum(o["wanted_bytes"] for o in owners)
    comfy = status.get("comfy") or {}
    if wanted == 0 and comfy.get("mode") == "dynamic":
        return (f"Viking Engine: ComfyUI's dynamic VRAM mode stages the weights itself ({human(comfy.get('pinned_bytes') or 0)} "
                f"pinned by ComfyUI); Viking keeps its pin ceiling within the budget ({status['budget']['reason']}).")
    text = f"Viking Engine: {human(pinned)} of your models' {human(wanted)} in RAM is page-locked: safe from {swap}."
    skipped: dict[str, int] = {}
    for owner in owners:
        for skip in owner["skipped"]:
            skipped[skip["reason"]] = skipped.get(skip["reason"], 0) + skip["bytes"]
    binding = max((r for r in skipped if r in ADVICE), key=skipped.get, default=None)
    if binding is not None:
        why = status["budget"]["reason"] if binding == "over_budget" else "the locked-memory limit (ulimit -l)"
        # The shared headroom is set where it was set last: a variable fixes it, else the dialog.
        headroom = ("VIKING_HEADROOM_GIB" if status.get("headroom_source") == "VIKING_HEADROOM_GIB"
                    else "Settings > Viking Engine > RAM headroom")
        text += f" {human(skipped[binding])} left out: {why}. To pin it: {ADVICE[binding].format(headroom=headroom)}."
    return text


def status_text(status: dict) -> str:
    memory, budget = status["memory"], status["budget"]
    lines = [verdict(status), "Details:",
             f"Viking Engine {status['version']}: {human(status['pinned_bytes'])} pinned in {status['registrations']} region(s)"]
    room = f"room left {human(budget['room_bytes'])}"
    if budget["room_bytes"] > memory["available_ram"]:
        # The budget bounds how much of the RAM may be page-locked, not how much is free: the
        # weights it pins already sit in RAM, so pinning them takes no new memory.
        room += " (more than the available RAM: pinning weights that already sit in RAM takes no new memory)"
    lines.append(f"Budget: {human(budget['limit_bytes'])} ({budget['reason']}); {room}")
    for owner in status["owners"]:
        backends = ", ".join(f"{name} {human(b)}" for name, b in owner["by_backend"].items()) or "nothing pinned"
        lines.append(f"- {owner['label'] or owner['owner']}: {human(owner['pinned_bytes'])} of {human(owner['wanted_bytes'])} in RAM pinned ({backends}); priority {owner['priority']}")
        if owner.get("vram_bytes") or owner.get("vram_cap_bytes"):
            lines.append(f"    weights in VRAM {human(owner['vram_bytes'] or 0)}"
                         + (f" (cap {human(owner['vram_cap_bytes'])})" if owner["vram_cap_bytes"] else ""))
        if owner.get("prefetch"):
            pf = owner["prefetch"]
            lines.append(f"    streaming {pf['streamed_layers']} layers from pinned RAM, copies {human(pf['window_bytes'])} ahead"
                         + (f" ({human(pf['extra_bytes'])} beyond ComfyUI's own buffer)" if pf.get("extra_bytes") else ""))
        if owner.get("home_bytes"):
            lines.append(f"    pinned home: {human(owner['home_bytes'])} of RAM keeps those weights for a free unload")
        if owner.get("home_note"):
            lines.append(f"    {owner['home_note']}")
        if owner.get("file_page_bytes"):
            lines.append(f"    {human(owner['file_page_bytes'])} of it locked as the checkpoint file's own pages (nothing copied)")
        if owner.get("resident_bytes") is not None:
            lines.append(f"    in RAM {human(owner['resident_bytes'])}, swapped out {human(owner['swapped_bytes'])}"
                         + _sample_age(status))
        for skip in owner["skipped"]:
            lines.append(f"    skipped {human(skip['bytes'])} in {skip['count']} range(s): {skip['description']}")
        dynamic = owner.get("dynamic")
        if dynamic:
            checkpoint = ("" if dynamic.get("checkpoint_bytes") is None else
                          f"; checkpoint in RAM {human(dynamic['checkpoint_resident_bytes'])} of "
                          f"{human(dynamic['checkpoint_bytes'])}{_sample_age(status)}")
            lines.append(f"    ComfyUI staged {human(dynamic['staged_bytes'])} ({human(dynamic['staged_pinned_bytes'])} pinned)"
                         + checkpoint
                         + ("" if dynamic.get("file_residency", True) else "; its file pages not kept (file_residency off)"))
            if dynamic.get("fast_disk"):
                lines.append("    ComfyUI reads this model's weights that have a VRAM slot from its file at each step (fast disk)"
                             + ("; Viking keeps those file pages in RAM" if dynamic.get("file_residency", True) else ""))
        for note in owner.get("notes", []):
            lines.append(f"    {note}")
        if owner.get("standing_aside"):
            lines.append(f"    {owner['standing_aside']}")
    lines.append(f"RAM: {human(memory['available_ram'])} available of {human(memory['total_ram'])}"
                 + (f" (container limit {human(memory['container_limit'])})" if memory.get("container_limit") else ""))
    pressure_line = _pressure_line(status.get("pressure"))
    if pressure_line:
        lines.append(pressure_line)
    paging = status["paging"]
    swap_name = "Pagefile" if paging.get("commit_limit") else "Swap"  # Windows reports its pagefile as swap
    swap_line = f"{swap_name}: {human(paging['swap_used'])} used of {human(paging['swap_total'])}"
    if paging.get("process_swapped_bytes") is not None:
        swap_line += f"; this process {human(paging['process_swapped_bytes'])} in swap"
    if paging.get("swapped_in_since_last_run") is not None:
        swap_line += (f"; machine paged in {human(paging['swapped_in_since_last_run'])}, out "
                      f"{human(paging['swapped_out_since_last_run'])} since the last status run "
                      f"({human(paging['swapped_in_since_start'])} / {human(paging['swapped_out_since_start'])} since start)")
    lines.append(swap_line)
    if paging.get("commit_limit"):
        lines.append(f"Windows: commit charge {human(paging['commit_limit'] - paging['commit_available'])} of "
                     f"{human(paging['commit_limit'])} (RAM + pagefile); page faults {paging.get('process_page_faults')}")
    if paging.get("working_set_minimum") is not None:
        lines.append(f"Windows: locked pages count against the working-set minimum, now {human(paging['working_set_minimum'])} "
                     "(Viking raises it as it pins; page-locking past ~40-50% of RAM fails there)")
    cuda = status["cuda"]
    if cuda["available"]:
        device = cuda["device"]
        lines.append(f"CUDA: {device['name']} (device {device['ordinal']}), {human(cuda['free_bytes'] or 0)} free of {human(cuda['total_bytes'] or 0)}")
    else:
        lines.append(f"CUDA: not used ({cuda['reason']})")
    build = status.get("native") or {}
    if build:
        stale = " (stale: rebuild with `bash scripts/build_wheels.sh` or `python -m pip install .`)" if build.get("matches_source") is False else ""
        lines.append(f"Native module: {build.get('origin')} {build.get('module_source_hash')}{stale}")
    comfy = status.get("comfy") or {}
    if comfy.get("version"):
        ceiling = f"; its pin ceiling {human(comfy['pin_ceiling_bytes'])}" if comfy.get("mode") == "dynamic" else ""
        lines.append(f"ComfyUI {comfy['version']} ({comfy['mode']}){ceiling}")
    if comfy.get("pinned_bytes"):
        lines.append(f"ComfyUI's own pinning: {human(comfy['pinned_bytes'])} in {comfy['pinned_tensors']} tensor(s) (counted in the budget)")
    for note in comfy.get("notes", []):
        lines.append(f"ComfyUI: {note}")
    for change in status.get("deferred_changes", []):
        lines.append(f"Waiting for the running prompt: {change}")
    counters = status["counters"]
    lines.append(f"Registrations: {counters['registrations']} made, {counters['releases']} released, {counters['failures']} failed")
    for event in status["events"][-5:]:
        lines.append(f"! {event}")
    return "\n".join(lines)

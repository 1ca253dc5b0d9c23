"""Where the garbage collector runs inside a real ComfyUI server: a node pack (no nodes) that logs
each collection of the oldest generation, and any other that takes 2 ms or more, with its
duration, its thread and the frames that set it off (Python's gc.callbacks); in a server with
Viking it also times each look of Viking's gate watcher. And the reading of those logs against
the prompts' start and end. Used by tests/test_gc_times.py and bench/probes/gc_times.py."""
import json
import statistics
from pathlib import Path

LOG_NAME = "gc_log.jsonl"
WATCH_LOG_NAME = "watch_log.jsonl"

# The pack each server loads: it only registers the callback (no nodes).
PACK = '''
import gc, json, sys, threading, time

_log = open({path!r}, "a", buffering=1)
_started = {{}}


def _frames():
    frame, names = sys._getframe(2), []
    while frame is not None and len(names) < 8:
        names.append("/".join(frame.f_code.co_filename.rsplit("/", 2)[-2:]) + ":" + frame.f_code.co_name)
        frame = frame.f_back
    return names


def _on_collection(phase, info):
    if phase == "start":
        _started[threading.get_ident()] = (time.time(), time.perf_counter())
        return
    at, began = _started.pop(threading.get_ident(), (None, None))
    if began is None:
        return
    ms = (time.perf_counter() - began) * 1000
    if info["generation"] == 2 or ms >= 2:
        _log.write(json.dumps(dict(at=at, generation=info["generation"], ms=round(ms, 2),
                                   thread=threading.current_thread().name, frames=_frames())) + "\\n")


gc.callbacks.append(_on_collection)
_looks = open({watch_path!r}, "a", buffering=1)


def _time_the_watcher():
    # Viking's pack may load after this one: wait for its gate module, then time each look.
    import os
    # (modules are searched only when more were imported, so that the search does not take
    # the GIL from a server without Viking through its prompts; copied in one call, as another
    # thread may be importing meanwhile)
    searched = 0
    for _ in range(600):
        if len(sys.modules) != searched:
            searched = len(sys.modules)
            gate = next((m for name, m in sys.modules.copy().items() if name.endswith(".gate")
                         and hasattr(m, "_watch_once") and hasattr(m, "AFTER_PROMPT_WATCH_SECONDS")), None)
            if gate is not None:
                break
        time.sleep(0.1)
    else:
        return  # no Viking in this server
    if os.environ.get("VIKING_PROBE_AFTER_PROMPT_WATCH_SECONDS"):
        gate.AFTER_PROMPT_WATCH_SECONDS = float(os.environ["VIKING_PROBE_AFTER_PROMPT_WATCH_SECONDS"])
    _looks.write(json.dumps(dict(at=time.time(), after_prompt_watch_seconds=gate.AFTER_PROMPT_WATCH_SECONDS)) + "\\n")
    look = gate._watch_once

    def timed_look():
        at, began = time.time(), time.perf_counter()
        try:
            look()
        finally:
            _looks.write(json.dumps(dict(at=at, ms=round((time.perf_counter() - began) * 1000, 3))) + "\\n")
    gate._watch_once = timed_look


threading.Thread(target=_time_the_watcher, name="viking-bench-watch-timer", daemon=True).start()
NODE_CLASS_MAPPINGS = {{}}
'''


def add_gc_pack(base) -> Path:
    """Puts the pack in ComfyUI base folder `base`; returns the log it will write."""
    log = Path(base).resolve() / LOG_NAME
    pack = Path(base) / "custom_nodes" / "viking_bench_gc"
    pack.mkdir(parents=True, exist_ok=True)
    (pack / "__init__.py").write_text(PACK.format(path=str(log), watch_path=str(log.with_name(WATCH_LOG_NAME))))
    return log


def read_log(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def in_prompts(collections: list[dict], prompts: list[dict]) -> list[dict]:
    """`prompts` (mode, stage index, start, end), each with the collections that began within it."""
    out = []
    for prompt in prompts:
        inside = [c for c in collections if prompt["start"] <= c["at"] < prompt["end"]]
        out.append({**prompt, "collections": inside,
                    "full_collection_ms": round(sum(c["ms"] for c in inside if c["generation"] == 2), 1)})
    return out


def summary(prompts: list[dict]) -> dict:
    """Per mode: the full collections' milliseconds inside its cold prompts and inside its later ones."""
    out = {}
    for prompt in prompts:
        mode = prompt["mode"].split("#")[0]
        entry = out.setdefault(mode, {"cold": [], "later": []})
        entry["cold" if prompt["index"] == 0 else "later"].append(prompt["full_collection_ms"])
    return {mode: {"servers": len(e["cold"]), "cold_full_collection_ms": e["cold"],
                   "later_full_collection_ms_per_prompt": round(statistics.mean(e["later"]), 1) if e["later"] else None}
            for mode, e in out.items()}


def watcher_in_prompts(looks: list[dict], prompts: list[dict]) -> list[dict]:
    """`prompts` of one server in order, each with the watcher's looks that began inside it (how
    many, their milliseconds) and those that began after it ended and before the next one
    began (the work left for the end of a prompt), with how far those ran on into the next."""
    out = []
    for i, prompt in enumerate(prompts):
        following = prompts[i + 1]["start"] if i + 1 < len(prompts) else float("inf")
        inside = [look for look in looks if prompt["start"] <= look["at"] < prompt["end"]]
        after = [look for look in looks if prompt["end"] <= look["at"] < following]
        into_next = sum(max(0.0, look["at"] + look["ms"] / 1000 - following) for look in after)
        out.append(dict(mode=prompt["mode"], index=prompt["index"], looks_inside=len(inside),
                        looks_inside_ms=round(sum(look["ms"] for look in inside), 3),
                        looks_after=len(after), looks_after_ms=round(sum(look["ms"] for look in after), 3),
                        into_next_prompt_ms=round(into_next * 1000, 3)))
    return out


def watcher_summary(rows: list[dict]) -> dict:
    """Per mode with Viking, the mean over its later prompts (not the cold one) of each figure."""
    out = {}
    for row in rows:
        if row["index"]:
            out.setdefault(row["mode"].split("#")[0], []).append(row)
    keys = ("looks_inside", "looks_inside_ms", "looks_after_ms", "into_next_prompt_ms")
    return {mode: {key: round(statistics.mean(r[key] for r in found), 3) for key in keys}
            for mode, found in out.items()}

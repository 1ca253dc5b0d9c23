"""The Viking nodes, declared once (see spec.py). Thin: each run() hands over to lifecycle.py,
which talks to the native engine; the planning and the budget live in Rust."""

from __future__ import annotations

import json

from . import comfy, gate, lifecycle, zero_copy
from .native import require
from .report import human, status_text
from .spec import ALWAYS, Input, NodeSpec, Output, Result

BACKENDS = ["auto", "cuda", "os-lock"]

SETTINGS_INPUTS = [
    Input("budget_gib", "FLOAT", default=0.0, min=0.0, max=4096.0, step=0.5,
          tooltip="Keep at most this many GiB of this model page-locked in RAM (safe from swap and the pagefile). "
                  "0 = as much as the shared RAM budget allows. Every mode."),
    Input("headroom_gib", "FLOAT", default=0.0, min=0.0, max=4096.0, step=0.5, advanced=True,
          tooltip="RAM that must stay un-pinned for everything else. Shared by all models: set it once in Settings > "
                  "Viking Engine > RAM headroom (or VIKING_HEADROOM_GIB). 0 here = leave the shared value as it is "
                  "(auto: 20% of RAM, 4-16 GiB); above 0 = set the shared value (the last node run wins). Every mode."),
    Input("backend", "COMBO", default="auto", options=BACKENDS, advanced=True,
          tooltip="auto: CUDA registration when ComfyUI computes on an NVIDIA GPU (fast DMA, no swap), else an OS "
                  "page lock (no swap). cuda / os-lock: that one only."),
    Input("priority", "INT", default=0, min=-100, max=100,
          tooltip="When RAM runs short, the pins of lower priorities go first. Every mode."),
    Input("pinned_home", "BOOLEAN", default=True, advanced=True,
          tooltip="Static mode (--disable-dynamic-vram, or ComfyUI 0.3.x) only: keep the pinned RAM copy while the "
                  "weights are in VRAM, so unloading copies nothing and reloading runs at full DMA speed. Costs RAM "
                  "equal to the weights in VRAM (within the budget)."),
]


def _pin(node_id: str, kind: str, value, budget_gib: float, headroom_gib: float, backend: str, priority: int,
         pinned_home: bool = True, vram_cap_gib: float = 0.0, prefetch: bool = True,
         file_residency: bool = True, zero_copy_tables: bool = False) -> Result:
    native = require()
    gate.note_execution_thread()  # ComfyUI runs nodes on its execution thread
    for name, number in (("budget_gib", budget_gib), ("headroom_gib", headroom_gib), ("vram_cap_gib", vram_cap_gib)):
        native.gib_to_bytes(name, float(number))  # the one rule for sizes; its ValueError says what to change
    if backend not in BACKENDS:
        raise ValueError(f"backend '{backend}' is not known; choose one of {', '.join(BACKENDS)}")
    # MODEL and CLIP: pin a clone, so the input is left as it was. VAE has no clone() in
    # ComfyUI 0.3.75: its patcher gets our keyed callbacks (added once).
    if kind == "MODEL":
        output = comfy.patcher_of(value, kind).clone()
        patcher = output
    elif kind == "CLIP":
        comfy.patcher_of(value, kind)
        output = value.clone()
        patcher = output.patcher
    else:
        patcher = comfy.patcher_of(value, kind)
        output = value
    notes = []
    previous = lifecycle.settings_of(patcher)
    if previous is not None and previous.node_id != node_id:
        notes.append(f"This {kind} was already pinned by Viking node #{previous.node_id}; the settings of node #{node_id} apply now.")
    label = f"{kind} {type(patcher.model).__name__} (node #{node_id})"
    settings = lifecycle.PinSettings(label=label, model_limit_gib=float(budget_gib), headroom_gib=float(headroom_gib),
                                     backend=backend, priority=int(priority), node_id=node_id,
                                     vram_cap_gib=float(vram_cap_gib), pinned_home=bool(pinned_home),
                                     prefetch=bool(prefetch), file_residency=bool(file_residency))
    try:
        report = lifecycle.attach(patcher, settings)
    except native.BackendUnavailableError as error:
        lifecycle.unpin(patcher)
        raise RuntimeError(f"{error}. Choose backend 'auto' or 'os-lock' on this machine.") from error
    if not report.get("standing_aside"):
        notes += zero_copy.apply(patcher, bool(zero_copy_tables))
    return Result((output,), _pin_text(report, notes, int(float(budget_gib) * 2**30)))


def _pin_text(report: dict, notes: list[str], node_budget_bytes: int = 0) -> str:
    if report.get("standing_aside"):
        return report["standing_aside"]
    budget = report["budget"]
    # Which limit binds only matters when something was left unpinned for it: this node's
    # budget_gib, or the shared budget.
    if lifecycle.skipped_for(report, "lock_limit"):
        budget_note = "limited by the locked-memory limit (ulimit -l; see below)"
    elif not lifecycle.skipped_for(report, "over_budget"):
        budget_note = f"budget room left {human(budget['room_bytes'])}"
    elif node_budget_bytes and report["pinned_bytes"] + (1 << 20) >= node_budget_bytes:
        budget_note = f"limited by this node's budget_gib: {human(node_budget_bytes)}"
    else:
        budget_note = budget["reason"]
    lines = [f"Pinned {human(report['pinned_bytes'])} of {human(report['wanted_bytes'])} in RAM "
             f"({report['backend']}); {budget_note}"]
    lines += [f"skipped {human(s['bytes'])}: {s['description']}" for s in report["skipped"]]
    lines += [f"released {human(b)} of a lower-priority model to make room" for _, b in report["evicted"]]
    lines += [f"failed: {f}" for f in report["failures"]]
    lines += report.get("notes", [])
    if report.get("home_bytes"):
        lines.append(f"pinned home: {human(report['home_bytes'])} of RAM kept for the weights in VRAM")
    if report.get("home_note"):
        lines.append(report["home_note"])
    return "\n".join(lines + notes)


VRAM_CAP = Input("vram_cap_gib", "FLOAT", default=0.0, min=0.0, max=4096.0, step=0.5, advanced=True,
                 tooltip="Static mode only: keep at most this many GiB of the model's weights in VRAM; the rest stays "
                         "in pinned RAM and streams to the GPU at each step. 0 = let ComfyUI decide.")
PREFETCH = Input("prefetch", "BOOLEAN", default=True, optional=True, advanced=True,  # optional: saved API graphs stay valid
                 tooltip="Static mode only: copy the weights that stream from RAM (low VRAM, or a VRAM cap) to the GPU "
                         "ahead of the layers that need them. Off: ComfyUI streams them alone.")

FILE_RESIDENCY = Input("file_residency", "BOOLEAN", default=True, optional=True, advanced=True,  # optional and last: saved graphs stay valid
                       tooltip="Dynamic VRAM mode (ComfyUI 0.33+'s default on NVIDIA) only: keep the checkpoint pages this model reads from its file (the "
                               "weights ComfyUI does not stage) locked in RAM, within the budget, so memory pressure cannot force "
                               "re-reads from disk. Costs RAM equal to those pages. Off: ComfyUI's own staging only.")

ZERO_COPY = Input("zero_copy_embeddings", "BOOLEAN", default=False, optional=True, advanced=True,  # optional and last: saved graphs stay valid
                  tooltip="NVIDIA GPU, static mode (--disable-dynamic-vram, or ComfyUI 0.3.x): the token-embedding tables "
                          "(read only by index) stay in pinned RAM and the GPU reads the rows a prompt needs in place, so they "
                          "take no VRAM. Use it with a large-vocabulary text encoder (Llama, Qwen: about 1 GB of table) when "
                          "VRAM is short beside the diffusion model. Off where a LoRA patches the table, on the CPU and "
                          "in dynamic VRAM mode (the status says why).")


def _status(node_id: str, after=None) -> Result:
    # Served from what is at hand and the residency sampler's last figures: reading the page
    # tables of every pinned page here would cost the prompt ~24 ms per GiB (residency.py).
    status = lifecycle.status(probe_cuda=True, mark_run=True, read_residency=False)
    text = status_text(status)
    return Result((text, json.dumps(status)), text)


def _unpin(node_id: str, model=None, clip=None, vae=None, everything: bool = False) -> Result:
    require()
    if everything:
        zero_copy.restore_all()  # the tables become parameters again before their pins go
        released = lifecycle.unpin(None)
        return Result((), f"Released every Viking pin: {human(released)}")
    released, names = 0, []
    for kind, value in (("MODEL", model), ("CLIP", clip), ("VAE", vae)):
        if value is not None:
            zero_copy.restore(comfy.patcher_of(value, kind))
            released += lifecycle.unpin(comfy.patcher_of(value, kind))
            names.append(kind)
    if not names:
        return Result((), "Nothing to unpin: connect a MODEL, CLIP or VAE, or switch 'everything' on.")
    return Result((), f"Released {human(released)} pinned for the {', '.join(names)}")


def _pin_spec(node_id: str, kind: str, display: str, description: str, extra_inputs=(), last_inputs=()) -> NodeSpec:
    name = kind.lower()
    return NodeSpec(
        node_id=node_id,
        display_name=display,
        description=description,
        inputs=[Input(name, kind)] + SETTINGS_INPUTS + list(extra_inputs) + [FILE_RESIDENCY] + list(last_inputs),
        outputs=[Output(kind, kind)],
        run=lambda node_id, **i: _pin(node_id, kind, i[name], i["budget_gib"], i["headroom_gib"], i["backend"],
                                      i["priority"], i.get("pinned_home", True), i.get("vram_cap_gib", 0.0),
                                      i.get("prefetch", True), i.get("file_residency", True),
                                      i.get("zero_copy_embeddings", False)),
        # Cached like any node, but re-run after a Viking Unpin so the model is pinned again.
        fingerprint=lifecycle.unpin_generation,
        # ComfyUI runs output nodes, and the nodes that feed them, first (ux_friendly_pick_node).
        # As a plain node between loader and sampler, the Pin node made ComfyUI sample the first
        # model before it loaded the second (any such node does, a LoRA loader too); as an output
        # node every loader feeding a Pin node runs before the first sampler, as without Viking.
        output_node=True,
    )


SPECS = [
    # The words in brackets are for ComfyUI 0.3.x's node search, which matches names only (no
    # search aliases) and only near their start: they find the node there too.
    _pin_spec("VikingPinModel", "MODEL", "Viking Pin Model (swap, offload)",
              "Memory: keeps the diffusion model's weights that sit in RAM page-locked (never swapped out to "
              "swap or the pagefile; full-speed "
              "copies to the GPU), within a RAM budget. Returns a clone; the pins follow the weights as "
              "ComfyUI loads and unloads them. With a pinned home, unloading copies nothing and reloading "
              "runs at DMA speed. Optionally caps the VRAM the model's weights take; the rest streams from "
              "pinned RAM, prefetched ahead of the layers that need it.",
              extra_inputs=[VRAM_CAP, PREFETCH]),
    _pin_spec("VikingPinCLIP", "CLIP", "Viking Pin CLIP",
              "Memory: keeps the text encoder's weights that sit in RAM page-locked (never swapped out), within the RAM "
              "budget, as Viking Pin Model does for the diffusion model.",
              last_inputs=[ZERO_COPY]),
    _pin_spec("VikingPinVAE", "VAE", "Viking Pin VAE",
              "Memory: keeps the VAE's weights that sit in RAM page-locked (never swapped out), within the RAM budget, "
              "as Viking Pin Model does for the diffusion model."),
    NodeSpec(
        node_id="VikingMemoryStatus",
        display_name="Viking Memory Status (swap, pagefile)",
        description="What Viking has pinned, the budget and what bounds it, RAM, swap and CUDA memory.",
        inputs=[Input("after", "*", optional=True, tooltip="Wire any output here to show the status after that node ran.")],
        outputs=[Output("STRING", "text"), Output("STRING", "json")],
        run=_status,
        output_node=True,
        fingerprint=ALWAYS,
    ),
    NodeSpec(
        node_id="VikingUnpin",
        display_name="Viking Unpin",
        description="Memory: lets go of the page-locked RAM Viking holds for the connected model(s), or of all of it. "
                    "The weights stay where they are; the OS may page them out again.",
        inputs=[Input("model", "MODEL", optional=True, tooltip="The model whose pins to release."),
                Input("clip", "CLIP", optional=True, tooltip="The text encoder whose pins to release."),
                Input("vae", "VAE", optional=True, tooltip="The VAE whose pins to release."),
                Input("everything", "BOOLEAN", default=False, optional=True,
                      tooltip="On: release every pin Viking holds, whatever is connected.")],
        outputs=[],
        run=_unpin,
        output_node=True,
        fingerprint=ALWAYS,
    ),
]

"""Each node is declared once, as plain data (`NodeSpec`), and built either as a V3 node
(`comfy_api.latest`, ComfyUI 0.3.6x and later) or as a classic V1 class for older ComfyUI.
ComfyUI's loader takes NODE_CLASS_MAPPINGS over comfy_entrypoint when both exist, so the package
exports only one of the two (see the root __init__.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# Under "memory" in the node menu: these nodes page-lock model weights in RAM; they have nothing
# to do with the canvas's own "pin" (lock a node's position).
CATEGORY = "memory/Viking Engine"
SEARCH_ALIASES = ["swap", "pagefile", "page lock", "pinned memory", "offload", "lowvram", "ram", "vram"]


@dataclass
class Input:
    name: str
    kind: str  # MODEL CLIP VAE FLOAT INT BOOLEAN COMBO *
    default: object = None
    min: float | None = None
    max: float | None = None
    step: float | None = None
    options: list[str] = field(default_factory=list)
    optional: bool = False
    tooltip: str = ""
    advanced: bool = False  # folded away in frontends that know V3's `advanced` flag


@dataclass
class Output:
    kind: str
    name: str


@dataclass
class Result:
    """What a node's `run` returns: its outputs and the text shown in the node."""
    outputs: tuple
    text: str = ""


@dataclass
class NodeSpec:
    node_id: str
    display_name: str
    description: str
    inputs: list[Input]
    outputs: list[Output]
    run: Callable[..., Result]  # run(node_id: str, **inputs) -> Result
    output_node: bool = False
    # Decides re-runs beyond input changes: ComfyUI re-runs the node when this value differs
    # from the last run's. `ALWAYS` (NaN, never equal to itself) re-runs every time.
    fingerprint: Callable[[], object] | None = None


def ALWAYS():
    return float("nan")


def v3_class(spec: NodeSpec):
    import dataclasses
    import inspect

    from comfy_api.latest import io, ui

    # Newer comfy_api versions take an input's `advanced` flag and a schema's search aliases;
    # decided by what this ComfyUI's classes accept, not by its version number.
    takes_advanced = "advanced" in inspect.signature(io.Float.Input.__init__).parameters
    takes_aliases = "search_aliases" in {f.name for f in dataclasses.fields(io.Schema)}

    def make_input(i: Input):
        common = dict(optional=i.optional, tooltip=i.tooltip or None)
        if takes_advanced and i.advanced:
            common["advanced"] = True
        if i.kind == "MODEL":
            return io.Model.Input(i.name, **common)
        if i.kind == "CLIP":
            return io.Clip.Input(i.name, **common)
        if i.kind == "VAE":
            return io.Vae.Input(i.name, **common)
        if i.kind == "*":
            return io.AnyType.Input(i.name, **common)
        if i.kind == "FLOAT":
            return io.Float.Input(i.name, default=i.default, min=i.min, max=i.max, step=i.step, **common)
        if i.kind == "INT":
            return io.Int.Input(i.name, default=i.default, min=i.min, max=i.max, **common)
        if i.kind == "BOOLEAN":
            return io.Boolean.Input(i.name, default=i.default, **common)
        if i.kind == "COMBO":
            return io.Combo.Input(i.name, options=i.options, default=i.default, **common)
        raise ValueError(f"unknown input kind {i.kind}")

    def make_output(o: Output):
        kinds = {"MODEL": io.Model, "CLIP": io.Clip, "VAE": io.Vae, "STRING": io.String}
        return kinds[o.kind].Output(display_name=o.name)

    class Node(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(
                node_id=spec.node_id,
                display_name=spec.display_name,
                category=CATEGORY,
                description=spec.description,
                inputs=[make_input(i) for i in spec.inputs],
                outputs=[make_output(o) for o in spec.outputs],
                hidden=[io.Hidden.unique_id],
                is_output_node=spec.output_node,
                **({"search_aliases": SEARCH_ALIASES} if takes_aliases else {}),
            )

        @classmethod
        def execute(cls, **inputs):
            result = spec.run(str(cls.hidden.unique_id), **inputs)
            return io.NodeOutput(*result.outputs, ui=ui.PreviewText(result.text) if result.text else None)

        if spec.fingerprint is not None:
            @classmethod
            def fingerprint_inputs(cls, **_inputs):
                return spec.fingerprint()

    Node.__name__ = Node.__qualname__ = spec.node_id
    return Node


def v1_class(spec: NodeSpec):
    def input_type(i: Input):
        if i.kind == "COMBO":
            return (i.options, {"default": i.default, "tooltip": i.tooltip})
        options = {k: v for k, v in dict(default=i.default, min=i.min, max=i.max, step=i.step, tooltip=i.tooltip).items() if v not in (None, "")}
        return (i.kind, options)

    class Node:
        CATEGORY = CATEGORY
        DESCRIPTION = spec.description
        RETURN_TYPES = tuple(o.kind for o in spec.outputs)
        RETURN_NAMES = tuple(o.name for o in spec.outputs)
        FUNCTION = "execute"
        OUTPUT_NODE = spec.output_node

        @classmethod
        def INPUT_TYPES(cls):
            return {
                "required": {i.name: input_type(i) for i in spec.inputs if not i.optional},
                "optional": {i.name: input_type(i) for i in spec.inputs if i.optional},
                "hidden": {"unique_id": "UNIQUE_ID"},
            }

        def execute(self, unique_id="", **inputs):
            result = spec.run(str(unique_id), **inputs)
            return {"ui": {"text": [result.text]}, "result": result.outputs} if result.text else result.outputs

        if spec.fingerprint is not None:
            @classmethod
            def IS_CHANGED(cls, **_inputs):
                return spec.fingerprint()

    Node.__name__ = Node.__qualname__ = spec.node_id
    return Node

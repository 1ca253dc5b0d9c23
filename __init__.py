"""Viking Engine, a ComfyUI custom node: keeps model weights page-locked in RAM (never swapped,
full-speed DMA to the GPU) within a RAM budget. Drop this folder into ComfyUI/custom_nodes/ (or
install it with ComfyUI-Manager / comfy-cli): the native module ships prebuilt in wheels/, so no
install step is needed (README.md, Install).

ComfyUI's loader prefers NODE_CLASS_MAPPINGS over comfy_entrypoint when a module has both, so
exactly one is exported: V3 nodes where comfy_api.latest exists, classic V1 classes elsewhere."""

from .comfy_node.nodes import SPECS
from .comfy_node.spec import v1_class, v3_class

WEB_DIRECTORY = "./web"

from .comfy_node import gate as _gate

try:  # the HTTP routes, the gate's watcher and engine mode exist only inside a ComfyUI server
    from .comfy_node import routes as _routes  # noqa: F401
    from .comfy_node import engine_mode as _engine_mode
    from .comfy_node import shared_settings as _shared_settings
except ImportError:
    _engine_mode = None
if _engine_mode is not None:
    _gate.start(watch=True)
    _shared_settings.start()
    _engine_mode.start()
elif _gate.comfy.host().version is not None:
    # ComfyUI without its server (embedded in another program): pressure relief still waits for
    # the execution thread, never the native monitor's own thread.
    _gate.start(watch=False)

import os as _os

try:
    from comfy_api.latest import ComfyExtension
except ImportError:  # ComfyUI older than the V3 node API
    ComfyExtension = None
if _os.environ.get("VIKING_FORCE_V1_NODES") == "1":  # the tests' way to run the fallback on a new ComfyUI
    ComfyExtension = None

if ComfyExtension is not None:

    class VikingExtension(ComfyExtension):
        async def get_node_list(self):
            return [v3_class(spec) for spec in SPECS]

    async def comfy_entrypoint():
        return VikingExtension()

else:
    NODE_CLASS_MAPPINGS = {spec.node_id: v1_class(spec) for spec in SPECS}
    NODE_DISPLAY_NAME_MAPPINGS = {spec.node_id: spec.display_name for spec in SPECS}

__all__ = ["WEB_DIRECTORY"] + (["comfy_entrypoint"] if ComfyExtension is not None else ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"])

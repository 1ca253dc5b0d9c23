"""HTTP routes on ComfyUI's own server (imported only inside ComfyUI)."""

import json

from aiohttp import web
from server import PromptServer

from .native import native, INSTALL_HINT
from .report import status_text


@PromptServer.instance.routes.get("/viking/status")
async def viking_status(request):
    """The status JSON (what the status node shows), plus its text form under "text"."""
    if native is None:
        return web.json_response({"error": INSTALL_HINT}, status=503)
    status = json.loads(native.status_json(probe_cuda=request.query.get("probe_cuda") == "1"))
    status["text"] = status_text(status)
    return web.json_response(status)

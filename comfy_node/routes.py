"""HTTP routes on ComfyUI's own server (imported only inside ComfyUI). They run on the server's
thread: changes go through gate.submit, which applies them at once when no prompt runs and
otherwise hands them to the execution thread (the answer then says "deferred")."""

import json
import asyncio
import os

from aiohttp import web
from server import PromptServer

from . import engine_mode, gate, lifecycle, shared_settings
from .native import native, INSTALL_HINT
from .report import status_text


def _foreign_origin(request) -> bool:
    """A browser page from another site may not change Viking's state: its Origin must be this
    server's own host (a missing Origin means a non-browser client such as curl or a script)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    return origin.split("://", 1)[-1].rstrip("/") != request.host


def _json_error(error_class, message: str):
    return error_class(text=json.dumps({"error": message}), content_type="application/json")


def _guard(request, action: str):
    """Raises the error response for a request from another origin, or without the native
    module."""
    if _foreign_origin(request):
        raise _json_error(web.HTTPForbidden, f"requests from another origin may not {action} Viking's state")
    if native is None:
        raise _json_error(web.HTTPServiceUnavailable, INSTALL_HINT)


async def _change_request(request) -> dict:
    """The JSON object of a request that changes Viking's state, once it passed the guard."""
    _guard(request, "change")
    if request.content_type != "application/json":
        raise _json_error(web.HTTPBadRequest, "send a JSON body with Content-Type: application/json")
    try:
        body = await request.json()
    except ValueError:
        raise _json_error(web.HTTPBadRequest, "the body is not valid JSON")
    if not isinstance(body, dict):
        raise _json_error(web.HTTPBadRequest, "the body must be a JSON object")
    return body


@PromptServer.instance.routes.get("/viking/status")
async def viking_status(request):
    """The status JSON (what the status node shows), plus its text form under "text". The
    residency figures are the sampler's last (status["residency"] gives their age); with
    ?residency=now they are read for this answer (page tables: milliseconds per GiB pinned)."""
    _guard(request, "read")
    probe_cuda = request.query.get("probe_cuda") == "1"
    read_now = request.query.get("residency") == "now"
    # Off the event loop: the server's every request and websocket message waits while it is busy.
    status = await asyncio.get_running_loop().run_in_executor(None, _status_with_text, probe_cuda, read_now)
    return web.json_response(status)


def _status_with_text(probe_cuda: bool, read_now: bool) -> dict:
    status = lifecycle.status(probe_cuda=probe_cuda, read_residency=read_now)
    status["text"] = status_text(status)
    return status


@PromptServer.instance.routes.post("/viking/unpin")
async def viking_unpin(request):
    """{"owner": <id from the status>} releases one model's pins; {"all": true} every pin."""
    body = await _change_request(request)
    if body.get("all") is True:
        return web.json_response(_outcome(gate.submit("unpin every model", lambda: lifecycle.unpin(None))))
    owner = body.get("owner")
    if isinstance(owner, bool) or not isinstance(owner, int) or owner < 0:
        return web.json_response({"error": 'give {"owner": <an owner id from /viking/status>} or {"all": true}'}, status=400)
    labels = lifecycle.labels()  # every model Viking pins in ComfyUI goes through lifecycle
    if owner not in labels:
        return web.json_response({"error": f"no pinned model has owner id {owner}; see /viking/status"}, status=404)
    return web.json_response(_outcome(gate.submit(f"unpin '{labels[owner]}'", lambda: lifecycle.unpin_owner(owner))))


def _outcome(submitted: dict) -> dict:
    """{"released_bytes": N} when applied at once; {"deferred": what} while a prompt runs."""
    if submitted["applied"]:
        return {"released_bytes": submitted["result"]}
    return {"deferred": submitted["deferred"], "note": "applied when the running prompt reaches Viking or ends"}


@PromptServer.instance.routes.get("/viking/headroom")
async def viking_headroom_get(request):
    _guard(request, "read")
    return web.json_response({"headroom_gib": _headroom_gib(), "source": shared_settings.headroom_source()})


def _headroom_gib() -> float:
    return json.loads(native.budget_json())["budget"]["headroom_bytes"] / (1 << 30)


@PromptServer.instance.routes.post("/viking/headroom")
async def viking_headroom_set(request):
    """{"headroom_gib": N}: the RAM every model's pins leave free (0 = auto); the settings
    dialog calls this. Applied at once: a smaller budget releases pins at the next reconcile or
    pressure relief, both on the execution thread or between prompts."""
    body = await _change_request(request)
    if shared_settings.headroom_fixed():
        return web.json_response({"headroom_gib": _headroom_gib(), "error": f"the headroom is fixed by {shared_settings.HEADROOM_ENV} for this server"}, status=409)
    gib = body.get("headroom_gib")
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or gib < 0:
        return web.json_response({"error": 'give {"headroom_gib": N} with N >= 0 in GiB (0 = auto)'}, status=400)
    try:
        result = shared_settings.set_headroom(float(gib), "settings dialog")
    except ValueError as error:
        return web.json_response({"error": str(error)}, status=400)
    return web.json_response(result)


@PromptServer.instance.routes.get("/viking/engine")
async def viking_engine_get(request):
    _guard(request, "read")
    return web.json_response({"engine_mode": engine_mode.enabled()})


@PromptServer.instance.routes.post("/viking/engine")
async def viking_engine_set(request):
    """{"enabled": true|false}: engine mode on or off (the settings dialog calls this)."""
    body = await _change_request(request)
    if engine_mode.ENV in os.environ:
        return web.json_response({"engine_mode": engine_mode.enabled(), "error": f"engine mode is fixed by {engine_mode.ENV} for this server"}, status=409)
    if not isinstance(body.get("enabled"), bool):
        return web.json_response({"error": 'give {"enabled": true} or {"enabled": false}'}, status=400)
    wanted = body["enabled"]
    submitted = gate.submit(f"engine mode {'on' if wanted else 'off'}", lambda: engine_mode.set_enabled(wanted))
    if submitted["applied"]:
        return web.json_response(submitted["result"])
    return web.json_response({"engine_mode": engine_mode.enabled(), "deferred": submitted["deferred"]})

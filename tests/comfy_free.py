"""Dropping ComfyUI's models from a test, until what it should release is released.

ComfyUI applies a POST /free when its prompt worker next wakes. One that lands while the worker
collects garbage after a prompt wakes nobody, and waits for the next prompt or the worker's
next timeout (up to 1000 s in 0.33's main.py). ComfyServer.free waits a while before it posts,
which is enough on an idle machine; on a busy one (CI's two cores) the collection can take
longer, so a /free that has not taken effect is sent again."""

from comfy_server import wait_for


def free_until(server, released, tries=3, timeout=10.0):
    """POST /free (unload the models, drop the caches) until released() holds; True if it did."""
    for attempt in range(tries):
        server.free(unload_models=True, idle=1.5 if attempt == 0 else 0.2)
        if wait_for(released, timeout=timeout):
            return True
    return False

"""The node search finds Viking's nodes by the words the README gives ("swap", "pagefile",
"offload", "pin"), in a real headless Chromium, on both ComfyUI versions: 0.33's frontend (1.49.6)
also matches the nodes' search aliases; 0.3.75's (1.32.9) matches only node names and display
names, and only near their start, so the display names carry the words (comfy_node/nodes.py)."""

import shutil
import urllib.request

import pytest

from comfy_server import REPO_ROOT, ComfyServer, prepare_base_dir

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Which Viking node each word must find on every version (0.33 finds more: the aliases).
EXPECTED = {
    "pin": {"Viking Pin Model (swap, offload)", "Viking Pin CLIP", "Viking Pin VAE"},
    "swap": {"Viking Pin Model (swap, offload)", "Viking Memory Status (swap, pagefile)"},
    "offload": {"Viking Pin Model (swap, offload)"},
    "pagefile": {"Viking Memory Status (swap, pagefile)"},
}

ALL_NODES = {"Viking Pin Model (swap, offload)", "Viking Pin CLIP", "Viking Pin VAE",
             "Viking Memory Status (swap, pagefile)", "Viking Unpin"}


@pytest.fixture(scope="module")
def server(comfy_version, tmp_path_factory):
    base = prepare_base_dir(tmp_path_factory.mktemp("search"), custom_nodes={"viking_engine": REPO_ROOT})
    with ComfyServer(base, version=comfy_version) as srv:
        yield srv


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")
def test_search_words_find_the_nodes(server, comfy_version):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    # A returning user: no first-run templates dialog over the canvas.
    urllib.request.urlopen(urllib.request.Request(server.url + "/settings/Comfy.TutorialCompleted", data=b"true",
                                                  method="POST", headers={"Content-Type": "application/json"}), timeout=30)
    found = {}
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(server.url)
            page.wait_for_function("window.app && window.app.graph", timeout=60_000)
            page.evaluate("() => window.app.graph.clear()")   # an empty canvas to double-click on
            page.wait_for_timeout(1000)
            for word in EXPECTED:
                # A double-click on the empty canvas opens the node search box with its input
                # focused, as a user sees it (the first may come before the canvas takes clicks).
                for _ in range(10):
                    page.mouse.dblclick(800, 500)
                    page.wait_for_timeout(700)
                    if page.evaluate("() => document.activeElement && document.activeElement.tagName === 'INPUT'"):
                        break
                else:
                    pytest.fail("a double-click on the canvas opened no search box")
                page.keyboard.type(word)
                page.wait_for_timeout(1500)     # the results follow the typing
                found[word] = page.eval_on_selector_all(
                    "[role=option]",
                    "items => items.map(item => item.innerText.split('\\n')[0].trim())")
                page.keyboard.press("Escape")
                page.wait_for_timeout(300)
        finally:
            browser.close()
    for word, names in EXPECTED.items():
        assert names <= set(found[word]), (comfy_version, word, found[word])
        if comfy_version != "0.3.75":   # the aliases: every word finds every Viking node
            assert ALL_NODES <= set(found[word]), (comfy_version, word, found[word])

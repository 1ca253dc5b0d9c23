"""The web UI in a real headless Chromium (Debian's, driven by playwright): the memory panel shows
the pinned model, the status node shows its text in the node body, and the HTTP API refuses
other origins and bad bodies; on both ComfyUI versions (frontend 1.32.9 with 0.3.75, 1.49.6 with
0.33). The screenshot goes to the test's folder unless VIKING_SCREENSHOT names a path."""

import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from comfy_server import CKPT_NAME, REPO_ROOT, ComfyServer, cached_checkpoint, prepare_base_dir

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The README's picture is made on purpose, never by a plain test run:
# VIKING_SCREENSHOT=bench/results/ui_panel.png .venv/bin/python -m pytest tests/test_web_panel.py -k "0.33 and panel"
SCREENSHOT = os.environ.get("VIKING_SCREENSHOT")
BROWSER_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1600,1000"]



@pytest.fixture(scope="module")
def server(comfy_version, tmp_path_factory):
    base = prepare_base_dir(tmp_path_factory.mktemp("web"), checkpoint=cached_checkpoint(), custom_nodes={"viking_engine": REPO_ROOT})
    with ComfyServer(base, version=comfy_version) as srv:
        yield srv


def request(server, method, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text.strip() else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_http_api_guards_its_state(server):
    evil = {"Origin": "http://evil.example"}
    assert request(server, "GET", "/viking/status", headers=evil)[0] == 403
    assert request(server, "POST", "/viking/unpin", {"all": True}, headers=evil)[0] == 403
    code, answer = request(server, "POST", "/viking/unpin", raw=b"{not json")
    assert code == 400 and "not valid JSON" in answer["error"]
    code, answer = request(server, "POST", "/viking/unpin", {"owner": "model"})
    assert code == 400 and "owner id" in answer["error"]
    assert request(server, "POST", "/viking/unpin", {"owner": 12345})[0] == 404
    code, answer = request(server, "POST", "/viking/unpin", raw=b"all", headers={"Content-Type": "text/plain"})
    assert code == 400 and "Content-Type: application/json" in answer["error"]
    assert request(server, "GET", "/viking/status", headers={"Origin": server.url})[0] == 200
    assert request(server, "GET", "/api/viking/status")[0] == 200


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")
def test_panel_shows_the_pinned_model_in_a_real_browser(server, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    workflow = json.loads((REPO_ROOT / "workflows" / "viking_pin_checkpoint.json").read_text())
    for node in workflow["nodes"]:   # the template leaves the checkpoint to the user: pick the test's
        if node["type"] == "CheckpointLoaderSimple":
            node["widgets_values"] = [CKPT_NAME]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            # A returning user: no first-run templates dialog over the graph.
            request(server, "POST", "/settings/Comfy.TutorialCompleted", True)
            page.goto(server.url)
            page.wait_for_selector("#viking-panel .viking-title", timeout=60_000)
            # Nothing pinned yet: the panel says what to do. Folded at first: it covers no node.
            page.wait_for_selector("#viking-panel .viking-hint", timeout=30_000)
            assert page.evaluate("() => document.getElementById('viking-panel').dataset.folded") == "1"
            # Run the example workflow the way a user does: load it into the graph, queue it.
            page.wait_for_function("window.app && window.app.graph", timeout=60_000)
            page.evaluate("wf => window.app.loadGraphData(wf)", workflow)
            page.evaluate("() => window.app.queuePrompt(0, 1)")
            # The sidebar's Viking tab, docked beside the canvas, has the whole status.
            page.click(".viking-engine-tab-button")
            # The row can show before the pin lands (0 B, then the bytes at the next poll): wait for the bytes.
            page.wait_for_selector("#viking-sidebar .viking-owner[data-label^='MODEL']", timeout=120_000)
            page.wait_for_function(
                "() => [...document.querySelectorAll(\"#viking-sidebar .viking-owner[data-label^='MODEL']\")]"
                ".some(r => Number(r.dataset.pinnedBytes) > 50e6)", timeout=120_000)
            page.wait_for_function(
                "() => window.app.graph._nodes.some(n => n.type === 'VikingMemoryStatus' && "
                "(n.widgets || []).some(w => w.name === 'viking_text' && String(w.value).includes('pinned')))",
                timeout=120_000)
            sidebar_text = page.inner_text("#viking-sidebar")
            assert "Budget" in sidebar_text and "RAM" in sidebar_text and "Swap" in sidebar_text
            # The verdict first (the status text's first line), in both places.
            for place in ("#viking-sidebar", "#viking-panel"):
                assert "page-locked: safe from swap" in page.inner_text(f"{place} .viking-title"), sidebar_text
            labels = page.eval_on_selector_all("#viking-sidebar .viking-owner", "rows => rows.map(r => r.dataset.label)")
            assert {label.split()[0] for label in labels} == {"MODEL", "CLIP", "VAE"}
            assert page.eval_on_selector_all("#viking-panel .viking-owner", "rows => rows.length") == 0  # still folded
            page.wait_for_timeout(500)
            shot = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "ui_panel.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000

            # A click on the floating line's first line unfolds it, another folds it again.
            page.click("#viking-panel .viking-title")
            page.wait_for_selector("#viking-panel .viking-owner", timeout=10_000)
            assert "Budget" in page.inner_text("#viking-panel")
            page.click("#viking-panel .viking-title")
            page.wait_for_function("() => document.getElementById('viking-panel').dataset.folded === '1'", timeout=10_000)
            assert page.eval_on_selector_all("#viking-panel .viking-owner", "rows => rows.length") == 0
            # The settings dialog's switch hides and shows it.
            page.evaluate("() => window.app.extensionManager.setting.set('Viking.ShowPanel', false)")
            page.wait_for_function("() => document.getElementById('viking-panel').style.display === 'none'", timeout=10_000)
            page.evaluate("() => window.app.extensionManager.setting.set('Viking.ShowPanel', true)")
            page.wait_for_function("() => document.getElementById('viking-panel').style.display === ''", timeout=10_000)

            # The engine-mode switch of the settings dialog reaches the server, both ways.
            assert request(server, "GET", "/viking/engine")[1] == {"engine_mode": False}
            page.evaluate("() => window.app.extensionManager.setting.set('Viking.EngineMode', true)")
            page.wait_for_function("async () => (await (await fetch('/viking/engine')).json()).engine_mode === true", timeout=30_000)
            page.evaluate("() => window.app.extensionManager.setting.set('Viking.EngineMode', false)")
            page.wait_for_function("async () => (await (await fetch('/viking/engine')).json()).engine_mode === false", timeout=30_000)
            # The shared RAM headroom lives in the settings dialog: a change there reaches the server.
            page.evaluate("() => window.app.extensionManager.setting.set('Viking.HeadroomGiB', 6)")
            page.wait_for_function("async () => (await (await fetch('/viking/headroom')).json()).headroom_gib === 6", timeout=30_000)
            assert request(server, "GET", "/viking/headroom")[1] == {"headroom_gib": 6.0, "source": "settings dialog"}
        finally:
            browser.close()

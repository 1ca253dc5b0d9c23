"""The floating verdict line in a real headless Chromium at 1600x1000, on both ComfyUI versions:
one line, whole; clear of the canvas's info text in the bottom left; under ComfyUI's modal
dialogs (their mask covers it, as it covers the canvas). And the Templates dialog lists the
pack's templates with their pictures.

The README's picture of the Templates dialog is made on purpose, never by a plain test run:
VIKING_SCREENSHOT_DIR=bench/results .venv/bin/python -m pytest tests/test_web_verdict.py -k "0.33 and templates"
writes ui_templates.png (its picture of the verdict, ui_panel.png, comes from tests/test_web_panel.py)."""

import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest

from comfy_server import REPO_ROOT, ComfyServer, api_prompt_from_ui_workflow, cached_checkpoint, prepare_base_dir

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT_DIR = os.environ.get("VIKING_SCREENSHOT_DIR")
WIDTH, HEIGHT = 1600, 1000
# LiteGraph draws its info text (T, I, N, V, FPS) 10 px from the canvas's left edge, from 80 px
# above its bottom down, 10 px Arial: well within this box.
INFO_TEXT_BOX = (160, 90)   # width from the canvas's left, height above its bottom


@pytest.fixture(scope="module")
def server(comfy_version, tmp_path_factory):
    base = prepare_base_dir(tmp_path_factory.mktemp("verdict"), checkpoint=cached_checkpoint(),
                            custom_nodes={"viking_engine": REPO_ROOT})
    with ComfyServer(base, version=comfy_version) as srv:
        workflow = json.loads((REPO_ROOT / "workflows" / "viking_pin_checkpoint.json").read_text())
        srv.run_prompt(api_prompt_from_ui_workflow(workflow, srv.object_info()))   # something pinned: a verdict
        yield srv


@pytest.fixture
def page(server):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if CHROMIUM is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    # A returning user: no first-run templates dialog over the canvas.
    urllib.request.urlopen(urllib.request.Request(server.url + "/settings/Comfy.TutorialCompleted", data=b"true",
                                                  method="POST", headers={"Content-Type": "application/json"}), timeout=30)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox", "--disable-gpu", f"--window-size={WIDTH},{HEIGHT}"])
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            page.goto(server.url)
            page.wait_for_function("window.app && window.app.graph", timeout=60_000)
            # The pins land once the prompt has ended: wait for a verdict on them.
            page.wait_for_function("() => (document.querySelector('#viking-panel .viking-title')?.textContent || '')"
                                   ".includes('page-locked')", timeout=180_000)
            yield page
        finally:
            browser.close()


def rect(page, selector):
    return page.evaluate(f"() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                         " return {left: r.left, top: r.top, right: r.right, bottom: r.bottom, height: r.height}; }")


def test_verdict_is_one_whole_line_clear_of_the_canvas_info(page, comfy_version):
    title = rect(page, "#viking-panel .viking-title")
    # One line whatever its length (a long verdict ends in an ellipsis; whole on hover).
    style = page.evaluate("() => { const s = getComputedStyle(document.querySelector('#viking-panel .viking-title'));"
                          " return [s.whiteSpace, s.textOverflow, s.overflow]; }")
    assert style == ["nowrap", "ellipsis", "hidden"], style
    line_height = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector('#viking-panel')).lineHeight)")
    assert title["height"] < 1.5 * line_height, (title, line_height)
    # The verdict of a model wholly pinned is whole at this width: nothing cut off by the ellipsis.
    # (Where RAM is short, a longer verdict says what was left out; its start shows, all of it on hover.)
    page.wait_for_function("() => document.querySelector('#viking-panel .viking-title').textContent"
                           ".endsWith('page-locked: safe from swap.')", timeout=180_000)
    widths = page.evaluate("() => { const t = document.querySelector('#viking-panel .viking-title');"
                           " return [t.scrollWidth, t.clientWidth, t.textContent]; }")
    assert widths[0] <= widths[1], widths
    canvas = rect(page, "canvas#graph-canvas")
    panel = rect(page, "#viking-panel")
    info_right, info_top = canvas["left"] + INFO_TEXT_BOX[0], canvas["bottom"] - INFO_TEXT_BOX[1]
    assert panel["left"] >= info_right or panel["bottom"] <= info_top, (panel, canvas)


def test_modal_dialog_covers_the_verdict(page):
    panel = rect(page, "#viking-panel")
    x, y = (panel["left"] + panel["right"]) / 2, (panel["top"] + panel["bottom"]) / 2
    # The stack of elements at the panel's middle, top first: where the panel is in it, where the canvas is.
    stack = (f"() => {{ const els = document.elementsFromPoint({x}, {y});"
             " return [els.findIndex(e => e.closest('#viking-panel')), els.findIndex(e => e.id === 'graph-canvas')]; }")
    in_panel, canvas = page.evaluate(stack)
    assert 0 <= in_panel < canvas, (in_panel, canvas)   # above the canvas
    page.evaluate("() => window.app.extensionManager.command.execute('Comfy.ShowSettingsDialog')")
    page.wait_for_selector("[role=dialog]", timeout=60_000)   # PrimeVue's (1.32) or reka-ui's (1.49)
    page.wait_for_timeout(500)
    in_panel, canvas = page.evaluate(stack)
    assert in_panel > 0, "the verdict stays above the modal dialog's mask"


def test_templates_dialog_lists_the_templates_with_their_pictures(page, server):
    page.evaluate("() => window.app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    page.wait_for_selector("[role=dialog]", timeout=60_000)
    page.get_by_text("viking_engine", exact=True).first.click(timeout=60_000)
    names = ["viking_pin_checkpoint", "viking_lowvram", "viking_two_models", "viking_flux", "viking_sdxl",
             "viking_wan22_two_experts"]
    for name in names:
        page.get_by_text(name, exact=True).first.wait_for(timeout=60_000)
    # Each card's picture loaded, 512 px wide: ours, not the frontend's placeholder. (1.49 shows
    # them as blob: URLs of what it fetched from /api/workflow_templates/viking_engine/<name>.jpg.)
    page.wait_for_function("() => [...document.querySelectorAll('[role=dialog] img')]"
                           ".filter(img => img.complete && img.naturalWidth === 512).length >= 6", timeout=60_000)
    if SCREENSHOT_DIR:
        page.wait_for_timeout(1000)
        page.screenshot(path=str(Path(SCREENSHOT_DIR) / "ui_templates.png"))

"""Shared test setup: the repository root (for `comfy_node`) and tests/ (for the harness
modules) on sys.path, since the tests are imported by path (see pyproject's pytest options);
the `comfy_version` fixture that runs a test once per ComfyUI version (comfy_server.COMFY_INSTALLS)."""

import glob
import json
import os
import shutil
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
for path in (ROOT, TESTS):
    if path not in sys.path:
        sys.path.insert(0, path)

import pytest  # noqa: E402

from comfy_server import COMFY_INSTALLS, comfy_install, comfy_unavailable  # noqa: E402


@pytest.fixture(scope="module", params=list(COMFY_INSTALLS), ids=list(COMFY_INSTALLS))
def comfy_version(request):
    """Each ComfyUI version in turn ("0.3.75", "0.33"); a version that is not installed skips
    with the reason (scripts/setup_env.sh prepares both). Module-scoped, so a module's server
    fixture can take it and start one server per version:

        @pytest.fixture(scope="module")
        def server(comfy_version, tmp_path_factory):
            with ComfyServer(prepare_base_dir(...), version=comfy_version) as srv:
                yield srv
    """
    reason = comfy_unavailable(request.param)
    if reason:
        pytest.skip(reason)
    return request.param


@pytest.fixture(scope="module")
def comfy_env(comfy_version):
    """The ComfyInstall of `comfy_version`: .tree and .python, for scripts run in-process
    (tests/*_check.py take the tree as their first argument and run under .python)."""
    return comfy_install(comfy_version)


def run_checks(install, script, *args, expected: int, env=None) -> dict:
    """Runs tests/SCRIPT under `install`'s Python with its tree first, the way the *_check.py
    scripts take it; they print named checks as JSON and exit 1 if one fails. Asserts every
    check passed and that there were `expected` of them (a check that went missing fails too)."""
    run = subprocess.run([str(install.python), f"{TESTS}/{script}", str(install.tree), *map(str, args)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert "{" in run.stdout, run.stderr[-3000:]
    checks = json.loads(run.stdout[run.stdout.index("{"):])
    failed = [name for name, ok in checks.items() if not ok]
    assert not failed and run.returncode == 0, (failed, run.stderr[-2000:])
    assert len(checks) == expected, checks
    return checks


# ---- test hosts: which tests ran on which, and skips that name what is missing ------------------
# A test runs on a host through the `comfy_version` fixture (or a `version` parameter) or by
# its mark `@pytest.mark.host("0.3.75" | "0.33" | "gguf", ...)`; a marked test whose host is
# missing skips with the reason (tests/hosts.py says where each host is and how to get it).
from hosts import HOST_NAMES, gguf_unavailable  # noqa: E402

_host_results: dict = {}   # nodeid -> (hosts, "passed" | "failed" | "skipped")
_skip_reasons: dict = {}   # nodeid -> why it skipped


def host_unavailable(host):
    return gguf_unavailable() if host == "gguf" else comfy_unavailable(host)


def hosts_of(item) -> set:
    hosts = set()
    params = getattr(getattr(item, "callspec", None), "params", {})
    for key in ("comfy_version", "version"):
        if params.get(key) in HOST_NAMES:
            hosts.add(params[key])
    for mark in item.iter_markers("host"):
        hosts.update(mark.args)
    return hosts


def pytest_configure(config):
    config.addinivalue_line("markers", "host(*names): the test runs on these test hosts (tests/hosts.py HOST_NAMES); "
                                       "it skips with the reason when one is missing")


def pytest_collection_modifyitems(config, items):
    for item in items:
        hosts = hosts_of(item)
        if hosts:
            _host_results[item.nodeid] = (hosts, None)


def pytest_runtest_setup(item):
    for mark in item.iter_markers("host"):
        for host in mark.args:
            why = host_unavailable(host)
            if why:
                pytest.skip(why)


def pytest_runtest_logreport(report):
    if report.nodeid not in _host_results:
        return
    hosts, outcome = _host_results[report.nodeid]
    if report.skipped:
        outcome = "skipped"
        # longrepr of a skip: (file, line, "Skipped: <reason>")
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skip_reasons[report.nodeid] = reason.removeprefix("Skipped: ")
    elif report.failed:
        outcome = "failed"
    elif report.when == "call" and outcome is None:
        outcome = "passed"
    _host_results[report.nodeid] = (hosts, outcome)


def pytest_terminal_summary(terminalreporter):
    """One line per host: how many tests ran on it and how many skipped and why (each reason once,
    with its count), so that a green run that touched none of ComfyUI 0.33's tests says so plainly."""
    terminalreporter.section("tests per test host")
    for host, name in HOST_NAMES.items():
        outcomes = [outcome for hosts, outcome in _host_results.values() if host in hosts and outcome]
        ran = sum(o in ("passed", "failed") for o in outcomes)
        failed, skipped = outcomes.count("failed"), outcomes.count("skipped")
        why = host_unavailable(host)
        reasons: dict = {}
        for nodeid, (hosts, outcome) in _host_results.items():
            if host in hosts and outcome == "skipped":
                reason = _skip_reasons.get(nodeid, "no reason given")
                reasons[reason] = reasons.get(reason, 0) + 1
        terminalreporter.write_line(f"host {name}: {ran} ran ({failed} failed), {skipped} skipped"
                                    + "".join(f"; {count} skipped: {reason}" for reason, count in reasons.items())
                                    + (f"; missing: {why}" if why else ""))


# ---- what the run leaves behind ------------------------------------------------------------------
# pytest's own folders go after a run that passed (pyproject: tmp_path_retention_policy). Wine,
# run by the Windows tests, leaves a /tmp/wine-* folder: those made during this session go once
# the project's wineserver (target/wineprefix) has ended.
_WINE_DIRS_BEFORE = set(glob.glob("/tmp/wine-*"))


def pytest_sessionfinish(session, exitstatus):
    made = set(glob.glob("/tmp/wine-*")) - _WINE_DIRS_BEFORE
    if not made:
        return
    if shutil.which("wineserver"):
        prefix = os.path.join(ROOT, "target", "wineprefix")
        subprocess.run(["wineserver", "-w"], env={**os.environ, "WINEPREFIX": prefix}, capture_output=True, timeout=60)
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)

"""scripts/setup_env.sh and a held apt lock: its optional system packages (browser, Wine, MinGW)
wait for the lock, and are skipped with the printed reason when it stays held; the set-up goes on.

The locks are real: this process takes apt's and dpkg's locks (/var/lib/apt/lists/lock,
/var/lib/dpkg/lock-frontend, the fcntl locks apt itself takes) while the set-up's
`install_optional` runs in a child shell. The package asked for, coreutils, is installed on
every Debian machine, so nothing new is installed."""

import fcntl
import os
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LOCKS = ("/var/lib/apt/lists/lock", "/var/lib/dpkg/lock-frontend")
PACKAGE = "coreutils"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("apt-get"),
                                reason="needs root and apt-get (the set-up installs system packages only there)")


@contextmanager
def held_apt_locks():
    """Holds apt's and dpkg's locks; skips when another apt-get or dpkg holds them now."""
    fds = []
    try:
        for path in LOCKS:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
            fds.append(fd)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pytest.skip(f"{path} is held by another apt-get or dpkg right now")
        yield fds
    finally:
        for fd in fds:
            os.close(fd)   # closing the descriptor lets go of its lock


def install_optional(timeout_s: int, deadline_s: int) -> tuple:
    """Runs setup_env.sh's install_optional for PACKAGE in a child bash; (exit status, output, seconds)."""
    script = f"source scripts/setup_env.sh && install_optional 'the test packages' {PACKAGE}"
    env = {**os.environ, "VIKING_APT_LOCK_TIMEOUT": str(timeout_s)}
    start = time.monotonic()
    run = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=deadline_s, stdin=subprocess.DEVNULL)
    return run.returncode, run.stdout + run.stderr, time.monotonic() - start


def test_optional_packages_are_skipped_with_the_reason_when_the_lock_stays_held():
    with held_apt_locks():
        status, output, seconds = install_optional(timeout_s=3, deadline_s=60)
    assert status == 0, output   # the set-up goes on
    assert "Could not get lock /var/lib/apt/lists/lock" in output, output
    assert "waiting up to 3 s" in output, output
    assert "skipped the test packages: apt-get failed: Could not get lock" in output, output
    assert seconds >= 3, f"gave up after {seconds:.1f} s without waiting for the lock"


def test_optional_packages_wait_for_a_lock_that_is_let_go():
    hold_s = 3
    with held_apt_locks() as fds:
        timer = threading.Timer(hold_s, lambda: [fcntl.lockf(fd, fcntl.LOCK_UN) for fd in fds])
        timer.start()
        try:
            status, output, seconds = install_optional(timeout_s=120, deadline_s=300)
        finally:
            timer.cancel()
    assert status == 0, output
    assert "waiting up to 120 s" in output, output
    assert "skipped" not in output, output
    assert seconds >= hold_s, output
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Status}", PACKAGE], capture_output=True, text=True)
    assert installed.stdout == "install ok installed"

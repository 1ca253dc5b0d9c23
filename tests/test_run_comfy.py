"""The main job (scripts/run_comfy.py) ends the ComfyUI server it started whatever signal ends it.

Each test starts the real main job the way a user's shell starts a background job (`cmd &` in
a non-interactive bash: SIGINT and SIGQUIT ignored), waits until it serves, sends it one signal
and checks that the script exits, the server's port is closed and the server process and every
process of its session are gone."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from comfy_server import VENV_PYTHON, comfy_unavailable, free_port

REPO = Path(__file__).resolve().parent.parent
SIGINT_BIT = 1 << (signal.SIGINT - 1)


def ignored_signals(pid) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^SigIgn:\s*([0-9a-f]+)", status, re.M).group(1), 16)


def alive(pid) -> bool:
    """True while `pid` exists and is not a zombie (a zombie serves nothing and holds no memory)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def session_members(sid) -> list:
    """Live processes whose session id is `sid` (the server runs in a session of its own)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                members.append(int(entry))
    return members


def port_open(port) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_shell_background_job_ignores_sigint():
    """What the SIGINT case below relies on: bash starts `cmd &` with SIGINT ignored, so a plain
    Python script there gets no KeyboardInterrupt (the defect the issue met)."""
    proc = subprocess.Popen(["bash", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        pid = int(proc.stdout.readline())
        deadline = time.monotonic() + 5
        # The disposition is read once the job has exec'd sleep (bash sets it in between).
        while not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ignored_signals(pid) & SIGINT_BIT, "bash did not start the background job with SIGINT ignored"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.host("0.3.75")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_ends_main_job_and_its_server(signum, tmp_path):
    if comfy_unavailable("0.3.75"):
        pytest.skip(comfy_unavailable("0.3.75"))
    port = free_port()
    log_path = tmp_path / "main_job.log"
    # The job's own shell in a session of its own, so that the test's signals reach only it.
    command = (f"{VENV_PYTHON} scripts/run_comfy.py --port {port} --base {tmp_path / 'base'} "
               f"> {log_path} 2>&1 & echo $!; wait")
    shell = subprocess.Popen(["bash", "-c", command], cwd=REPO, stdout=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    job = int(shell.stdout.readline())
    server_pid = None
    try:
        deadline = time.monotonic() + 240
        log_path.touch()   # the job's shell may not have opened it yet
        while "until Ctrl-C" not in log_path.read_text():
            assert shell.poll() is None, f"the main job ended early:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the main job did not serve within 240 s:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.5)
        log = log_path.read_text()
        server_pid = int(re.search(r"\(pid (\d+),", log).group(1))
        # A Pin node's skipped lines go under its model's line, indented (as in the status text).
        skipped = [line for line in log.splitlines() if "skipped" in line and "too small" in line]
        assert all(line.startswith(("[viking]     skipped", "    skipped")) for line in skipped), skipped
        assert alive(server_pid) and port_open(port)
        if signum == signal.SIGINT:
            # Python has replaced the ignored disposition with its handler.
            assert not ignored_signals(job) & SIGINT_BIT

        os.kill(job, signum)
        shell.wait(timeout=40)   # the server's own stop is bounded by 15 s (then SIGKILL)
        assert not alive(job), "the main job is still running"
        assert not port_open(port), f"port {port} still answers after {signum.name}"
        assert not alive(server_pid), f"the ComfyUI server (pid {server_pid}) outlived the main job"
        assert session_members(server_pid) == [], "a process of the server's session remained"
        assert f"[viking] {signum.name}: stopping the ComfyUI server" in log_path.read_text()
    finally:
        for pid in (job, server_pid):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
        if server_pid:
            for pid in session_members(server_pid):
                os.kill(pid, signal.SIGKILL)
        if shell.poll() is None:
            shell.kill()
            shell.wait()

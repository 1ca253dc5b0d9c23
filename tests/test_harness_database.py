"""The test servers' database (comfy_server.database_url) against the real ComfyUI and
SQLAlchemy of each version: the connection ComfyUI's init_db leaves behind is finalized by a
collection on another thread without a traceback, where an in-memory database logs three on
0.3.75 (the tracebacks the GPU server check once put down to Viking)."""

import json
import subprocess

from comfy_server import database_url
from conftest import TESTS


def errors_after_collection(install, url) -> list[str]:
    run = subprocess.run([str(install.python), f"{TESTS}/database_check.py", str(install.tree), url],
                         capture_output=True, text=True, timeout=120, cwd=str(install.tree))
    assert run.returncode == 0 and "{" in run.stdout, run.stderr[-3000:]
    result = json.loads(run.stdout[run.stdout.index("{"):])
    assert result["dependencies"], "SQLAlchemy and alembic are part of ComfyUI's requirements"
    return result["errors"]


def test_server_database_survives_a_collection_on_another_thread(comfy_env, tmp_path):
    assert errors_after_collection(comfy_env, database_url(tmp_path, 8188)) == []
    in_memory = errors_after_collection(comfy_env, "sqlite:///:memory:")
    if comfy_env.version == "0.3.75":
        # What the harness used before: the same collection logs SQLAlchemy's tracebacks.
        assert any("created in a thread can only be used in that same thread" in line for line in in_memory), in_memory
    else:
        assert in_memory == []  # 0.33 pools an in-memory database with check_same_thread off

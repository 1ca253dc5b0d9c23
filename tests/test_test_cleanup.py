"""The test run cleans up behind it: a pytest session that passes under this project's pytest
settings leaves no folder in pytest's temporary base (they hold ComfyUI base directories,
copies of the pack and images: gigabytes over the whole suite); and the per-host summary line
says why the skipped tests skipped. Each runs a real inner pytest on a small test file."""

import subprocess
import sys
from pathlib import Path

from comfy_server import REPO_ROOT
from hosts import gguf_unavailable

INNER = '''
import pytest

@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    (folder / "big").write_bytes(b"x" * 4096)
    print("BASETEMP", tmp_path_factory.getbasetemp())
    return folder

def test_writes(base, tmp_path):
    (tmp_path / "image.png").write_bytes(b"png")

@pytest.mark.host("gguf")
def test_on_a_host():
    pytest.skip("a reason this test gives")
'''


def run_inner(tmp_path):
    # The project's settings (pyproject.toml) and conftest: the inner file sits in a folder of tests/.
    inner_dir = REPO_ROOT / "tests" / f"_inner_{tmp_path.name}"
    inner_dir.mkdir()
    try:
        (inner_dir / "test_inner.py").write_text(INNER)
        run = subprocess.run([sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider",
                              str(inner_dir / "test_inner.py")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    finally:
        for path in inner_dir.iterdir():
            path.unlink()
        inner_dir.rmdir()
    return run


def test_a_passing_run_leaves_no_temporary_folder_and_says_why_tests_skipped(tmp_path):
    run = run_inner(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:]
    basetemp = Path(next(line.split()[1] for line in run.stdout.splitlines() if line.startswith("BASETEMP")))
    assert not basetemp.exists(), f"{basetemp} is left behind"
    host_line = next(line for line in run.stdout.splitlines() if line.startswith("host ComfyUI-GGUF:"))
    # Where the host is missing, its test skips with the host's reason before running.
    reason = gguf_unavailable() or "a reason this test gives"
    assert f"1 skipped: {reason}" in host_line, host_line

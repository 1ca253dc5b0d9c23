"""The docs' figures are the result files' figures: docs/benchmarks.md and the README's first table
are rendered from bench/results/ by scripts/figures.py, and here rendered again and compared, so
a figure and its file cannot drift apart and rewording prose breaks nothing. A figure is older
than its code when a path its benchmark declares changed since the commit the file records; the
rendered page names those files, so a change to the code a figure exercises fails here until the
page is rendered again (and says which figures to measure again)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import figures  # noqa: E402


def test_the_rendered_docs_are_what_the_result_files_give():
    try:
        figures.older_than_their_code()
    except figures.AgeUnknown as reason:
        pytest.skip(f"{reason}: the rendered page names the files older than their code")
    stale = [str(path.relative_to(REPO)) for path, text in figures.rendered().items() if path.read_text() != text]
    assert not stale, f"{stale} differ from what bench/results/ gives: run python scripts/figures.py render"


def test_every_result_file_is_declared_and_records_its_commit():
    for path in sorted(figures.RESULTS.glob("*.json")):
        assert path.name in figures.BENCHMARKS or path.name in figures.OF_OLDER_CODE, \
            f"{path.name}: declare it in scripts/figures.py (what it measures, the code it exercises, its command)"
        assert re.fullmatch(r"[0-9a-f]{7,40}", figures.recorded(path.name).get("commit", "")), f"{path.name} records no commit"


def test_every_declared_path_exists_or_is_a_file_still_to_come():
    """A declared path that exists nowhere ages nothing: a typo would hide a figure's age. The
    result files of benches still being written may declare their bench before it lands."""
    missing = set()
    for bench in figures.BENCHMARKS.values():
        if not (figures.RESULTS / bench.file).exists():
            continue
        missing |= {p for p in bench.paths if not p.startswith(":") and not (REPO / p).exists()}
    assert not missing, f"declared paths that do not exist: {sorted(missing)}"


def test_every_benchmark_file_the_readme_table_names_exists():
    table = figures.readme_table()
    for name in re.findall(r"`([\w.]+\.json)`", table):
        assert (figures.RESULTS / name).exists(), name


def test_speed_says_one_convention():
    assert figures.speed(2.4, 1.0) == "2.4x faster"
    assert figures.speed(1.0, 1.06) == "1.06x slower"
    assert figures.speed(1.07, 1.0) == "1.07x faster"
    assert figures.speed(1.0, 1.001) == "as fast (1.00x)"


def write(results, name, data):
    (results / name).write_text(json.dumps({"commit": "0000000", "command": "a test", **data}))


def test_the_ram_short_row_appears_once_its_file_exists(tmp_path):
    """The README's row for a machine short of RAM is rendered from ram_short_cpu.json (issue 61's
    keys) as soon as the file is there, and not before."""
    assert "short of RAM" not in figures.readme_table(tmp_path)
    prompts = lambda first, switch: [{"kind": "first", "seconds": first, "hash": "a"},  # noqa: E731
                                     {"kind": "after a switch", "seconds": switch, "hash": "a"}]
    write(tmp_path, "ram_short_cpu.json", {"profile": "16gb", "runs": [
        {"mode": "alone", "comfy": "0.33 dynamic", "prompts": prompts(10.0, 8.0)},
        {"mode": "pin_model", "comfy": "0.33 dynamic", "prompts": prompts(10.0, 2.0)}]})
    table = figures.readme_table(tmp_path)
    assert "a machine short of RAM (swap or pagefile in use), `--cpu`" in table
    assert "the prompt after a switch: **4.0x faster** (`ram_short_cpu.json`)" in table
    assert "after a switch" in figures.render_benchmarks(tmp_path, older={})
    # A kind of prompt slower with the Pin Model: the row quotes the slowest, not the gain.
    write(tmp_path, "ram_short_cpu.json", {"profile": "16gb", "runs": [
        {"mode": "alone", "comfy": "0.33 dynamic", "prompts": prompts(10.0, 8.0)},
        {"mode": "pin_model", "comfy": "0.33 dynamic", "prompts": prompts(25.0, 2.0)}]})
    assert "the slowest kind of prompt, first: **2.50x slower** (`ram_short_cpu.json`)" in figures.readme_table(tmp_path)


def test_a_headline_row_from_a_file_still_to_come(tmp_path):
    write(tmp_path, "zero_copy_gpu.json", {"headline": {"what": "text encoding", "alone_seconds": 1.0,
                                                        "viking_seconds": 1.25, "viking": "reads it in place"}})
    assert "text encoding: **1.25x slower** (`zero_copy_gpu.json`)" in figures.readme_table(tmp_path)


def test_the_first_prompt_row_quotes_the_slowest_case(tmp_path):
    write(tmp_path, "first_prompt_gpu.json", {"cases": {
        "fp16/0.33-dynamic": {"over_alone": {"pin": {"first": 0.98, "warm": 1.0}}},
        "gguf/0.3.75": {"over_alone": {"pin": {"first": 1.04, "warm": 1.0}}},
        "fp8_scaled/0.33-static": {"over_alone": {}}}})
    assert "the slowest of 2 cases (gguf, 0.3.75): **1.04x slower** (`first_prompt_gpu.json`)" in figures.readme_table(tmp_path)


def test_a_file_that_records_no_commit_counts_as_older(tmp_path):
    write(tmp_path, "swap_cpu.json", {})
    data = json.loads((tmp_path / "swap_cpu.json").read_text())
    del data["commit"]
    (tmp_path / "swap_cpu.json").write_text(json.dumps(data))
    assert figures.older_than_their_code(tmp_path) == {"swap_cpu.json": "(no commit recorded)"}


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_figure_ages_only_with_the_code_its_benchmark_declares(tmp_path):
    """A change to the OS lock ages a figure that ran the OS lock, not one that pinned through
    CUDA; a unit test's change ages none; a change to the core ages both."""
    repo, results = tmp_path / "repo", tmp_path / "repo" / "results"
    files = ["src/lib.rs", "src/backend/oslock.rs", "src/backend/cuda.rs", "src/engine/tests.rs"]
    for name in files:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("// one\n")
    results.mkdir()
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    declared = {"cuda.json": figures.Benchmark("cuda.json", "", figures.RUST_CORE + figures.CUDA, ""),
                "oslock.json": figures.Benchmark("oslock.json", "", figures.RUST_CORE + figures.OS_LOCK, "")}
    for name in declared:
        (results / name).write_text(json.dumps({"commit": commit}))

    def older_after_changing(name):
        (repo / name).write_text("// two\n")
        try:
            return set(figures.older_than_their_code(results, repo, declared))
        finally:
            (repo / name).write_text("// one\n")
    assert figures.older_than_their_code(results, repo, declared) == {}
    assert older_after_changing("src/backend/oslock.rs") == {"oslock.json"}
    assert older_after_changing("src/backend/cuda.rs") == {"cuda.json"}
    assert older_after_changing("src/engine/tests.rs") == set()
    assert older_after_changing("src/lib.rs") == {"cuda.json", "oslock.json"}


def test_no_user_doc_carries_a_commit_but_the_rendered_page():
    """Commits belong to the result files and the page rendered from them."""
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if page.name in ("benchmarks.md", "development.md"):
            continue
        found = re.findall(r"`([0-9a-f]{7,40})`", page.read_text())
        assert not found, f"{page.relative_to(REPO)} names commits {found}"


def test_every_relative_link_of_the_docs_resolves():
    """Links and pictures in the README and docs/ point at files that exist (a path relative to
    the page, as GitHub and the registry resolve it)."""
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "web" / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

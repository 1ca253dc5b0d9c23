"""Tests stand on their own: no test imports, runs or puts on its path anything under bench/. The
harness the tests and the benches share (servers, prompts, memory probes, the synthetic models)
lives in tests/, and bench/ imports it, never the other way round. Paths to bench/results/
(data, not code) are allowed."""

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BENCH = TESTS.parent / "bench"


def bench_modules():
    return {p.stem for p in BENCH.rglob("*.py")} - {p.stem for p in TESTS.rglob("*.py")}


def reaches_into_bench(source: str) -> list[str]:
    """Each place in `source` that imports a module of bench/, or names a path under bench/
    other than bench/results/ (docstrings, dict keys and subscripts such as data["bench"] aside)."""
    tree = ast.parse(source)
    modules, found = bench_modules(), []
    skipped = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skipped.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.Dict):
            skipped |= {id(key) for key in node.keys if key is not None}
        if isinstance(node, ast.Subscript):
            skipped.add(id(node.slice))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in modules]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in modules:
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and id(node) not in skipped:
            skipped |= {id(n) for n in ast.walk(node)}  # a path is judged whole: REPO / "bench" / "results" / ...
            parts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if "bench" in parts and "results" not in parts:
                found.append(f"line {node.lineno}: a path into bench/ ({' / '.join(parts)})")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "join":
            parts = [n.value for n in node.args if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            skipped |= {id(n) for n in node.args}
            if "bench" in parts and "results" not in parts:
                found.append(f"line {node.lineno}: a path into bench/ ({', '.join(parts)})")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            if node.value == "bench" or re.search(r"(^|[\s/'\"])bench/(?!results)", node.value):
                found.append(f"line {node.lineno}: {node.value[:80]!r}")
    return found


def test_no_test_reaches_into_bench():
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__):
            continue
        found = reaches_into_bench(path.read_text())
        if found:
            offenders[str(path.relative_to(TESTS.parent))] = found
    assert not offenders, f"tests that import or run bench/ (move what they need into tests/): {offenders}"


def test_the_check_finds_each_way_into_bench():
    """The check above can fail: each way a test could reach into bench/ is found, and what is
    allowed is not."""
    reaching = {
        "import gpu_dynamic": 1,
        "from gpu_dynamic import arg": 1,
        "sys.path.insert(0, str(REPO / 'bench'))": 1,
        "sys.path.insert(0, os.path.join(ROOT, 'bench', 'probes'))": 1,
        "subprocess.run([python, 'bench/gpu_dynamic.py'])": 1,
        "subprocess.run([python, str(REPO / 'bench' / 'probes' / 'node_times.py')])": 1,
    }
    for source, count in reaching.items():
        assert len(reaches_into_bench(source)) == count, source
    allowed = ['"""Figures in bench/gpu_dynamic.py."""', "out = REPO / 'bench' / 'results' / 'x.json'",
               "row = {'bench': 'x'}", "name = data['bench']", "import comfy_server", "path = 'bench/results/x.json'"]
    for source in allowed:
        assert reaches_into_bench(source) == [], source

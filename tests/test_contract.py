"""The native module's JSON and lifecycle.status() against the written contract
(comfy_node/contract.py), key by key and both ways, and the typed stub (viking_native.pyi)
against the module's functions: a field renamed on one side fails here."""

import ast
import json
from pathlib import Path

import pytest

vn = pytest.importorskip("viking_native")
torch = pytest.importorskip("torch")

from comfy_node import contract  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_report_and_status_match_the_contract():
    weights = torch.ones(1 << 20)
    storage = weights.untyped_storage()
    report = json.loads(vn.reconcile(424242, [(storage.data_ptr(), storage.nbytes(), storage)], backend="os-lock",
                                     label="contract"))
    try:
        assert report["pinned_bytes"] == storage.nbytes()  # a real pin, so no field is left empty
        assert contract.key_mismatches(report, contract.Report) == []
        status = json.loads(vn.status_json(probe_cuda=True))
        assert any(o["owner"] == 424242 for o in status["owners"])
        assert contract.key_mismatches(status, contract.NativeStatus) == []
        budget = json.loads(vn.budget_json())
        assert set(budget) == {"memory", "budget"}
        assert contract.key_mismatches(budget["memory"], contract.Memory) == []
        assert contract.key_mismatches(budget["budget"], contract.Budget) == []
    finally:
        vn.release(424242)


def test_the_check_sees_a_renamed_key():
    report = {"owner": 1, "backend": None, "wanted_bytes": 0, "pinned_bytes": 0, "pending_bytes": 0, "newly_pinned_bytes": 0,
              "released_bytes": 0, "regions_registered": 0, "failures": [], "skipped": [], "evicted": [],
              "budget": {"limit_bytes": 0, "pinned_bytes": 0, "room_bytes": 0, "excess_bytes": 0, "headroom_bytes": 0,
                         "bound_by": "user", "terms": [], "reason": "", "renamed": 1}}
    del report["budget"]["room_bytes"]
    assert contract.key_mismatches(report, contract.Report) == ["budget.renamed: not in Budget", "budget.room_bytes: missing"]


def test_the_stub_lists_every_function_with_its_parameters():
    stub = ast.parse((ROOT / "viking_native.pyi").read_text())
    stubbed = {node.name: [a.arg for a in node.args.args] for node in stub.body if isinstance(node, ast.FunctionDef)}
    exported = {name for name in dir(vn) if callable(getattr(vn, name)) and not isinstance(getattr(vn, name), type)}
    assert set(stubbed) == exported
    for name, params in stubbed.items():
        text = getattr(vn, name).__text_signature__ or ""
        assert [p.strip().split("=")[0] for p in text.strip("()").split(",") if p.strip() and p.strip() != "$module"] == params, name

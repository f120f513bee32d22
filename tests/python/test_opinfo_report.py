"""docs/ops.md's machinery (tools/opinfo_report.py, tools/opinfo_targets.py): the table reads
back as the report it was written from, target columns included, and the per-target sweep
counts what each GPU target compiles and refuses, with the target's own reason.

Run: cd /work/main && .venv/bin/python -m pytest tests/python/test_opinfo_report.py -q
"""

import copy
import os
import sys

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))

import opinfo_targets  # noqa: E402
from opinfo_cases import Case, tolerances  # noqa: E402
from opinfo_report import merge_reports, report_from_markdown, write_markdown  # noqa: E402

OPS_MD = os.path.join(ROOT, "docs", "ops.md")


@pytest.mark.parametrize("counts", [
    {"accepted": 7, "refused": 0, "failed": 0},
    {"accepted": 0, "refused": 8, "failed": 0},
    {"accepted": 3, "refused": 2, "failed": 1},
    {"accepted": 0, "refused": 0, "failed": 4},
])
def test_cell_reads_back(counts):
    c = dict(counts, reason="")
    assert opinfo_targets.read_cell(opinfo_targets.cell(c)) == c


def test_table_reads_back_with_target_columns(tmp_path):
    """docs/ops.md -> report -> table -> report -> table: the second table equals the first
    (nothing is lost or reordered), with target columns and reasons added to the report."""
    report = report_from_markdown(OPS_MD)
    names = [o["name"] for o in report["ops"] if "float32" in o.get("dtypes", {})][:5]
    assert len(names) == 5
    report["targets"] = {
        "webgpu": {names[0]: {"accepted": 2, "refused": 0, "failed": 0, "reason": ""},
                   names[1]: {"accepted": 1, "refused": 2, "failed": 0, "reason": "float64, which it cannot store"}},
        "cuda": {names[2]: {"accepted": 0, "refused": 0, "failed": 3, "reason": "CompileError: a defect"}},
    }
    report["targets_samples"] = "every float32 sample of each of 3 entries (one sweep, torch 2.x)"
    want = copy.deepcopy(report["targets"])
    first, second = tmp_path / "a.md", tmp_path / "b.md"
    write_markdown(report, str(first))
    back = report_from_markdown(str(first))
    assert back["targets"] == want
    assert back["targets_samples"] == report["targets_samples"]
    write_markdown(back, str(second))
    assert first.read_text() == second.read_text()
    text = first.read_text()
    assert "| OpInfo | run | dtype | pass | fail | unsupported | webgpu | cuda | first reason |" in text
    assert "## By target" in text and "float64, which it cannot store" in text


def test_target_sweep_merges_into_the_table(tmp_path):
    """A sweep-only report (no CPU rows) merged into the table adds its columns and keeps every
    CPU row."""
    import json

    report = report_from_markdown(OPS_MD)
    name = next(o["name"] for o in report["ops"] if "float32" in o.get("dtypes", {}))
    sweep = {"torch": torch.__version__, "dtypes": [], "ops": [], "seconds": 5.0,
             "targets": {"metal": {name: {"accepted": 4, "refused": 0, "failed": 0, "reason": ""}}}}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    merged = merge_reports([OPS_MD, str(path)])
    # The sweep's counts replace the table's for its entry; the table's other counts stay.
    want = copy.deepcopy(report.get("targets") or {})
    want.setdefault("metal", {}).update(sweep["targets"]["metal"])
    assert merged["targets"] == want
    assert merged["targets_samples"].endswith(f"every float32 sample of each of 1 entries (one sweep, torch {torch.__version__})")
    assert merged["seconds"] == report["seconds"]  # the sweep's time is not the CPU runs'
    rows = {o["name"]: sorted(o.get("dtypes", {})) for o in report["ops"]}
    assert {o["name"]: sorted(o.get("dtypes", {})) for o in merged["ops"]} == rows
    out = tmp_path / "ops.md"
    write_markdown(merged, str(out))
    row = next(line for line in out.read_text().splitlines() if line.startswith(f"| {name} | ") and "float32" in line)
    assert "| all 4 |" in row


def _cases(name, n):
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == name and not o.variant_test_name)
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:n]
    return [Case(op, s, tolerances(op, torch.float32)) for s in samples]


def test_sweep_counts_what_each_target_compiles(tmp_path):
    targets = ["webgpu", "cuda", "metal"]
    res = opinfo_targets.sweep_entry(_cases("abs", 2), targets, str(tmp_path / "abs"))
    for t in targets:
        assert res[t]["accepted"] >= 1 and res[t]["refused"] == 0 and res[t]["failed"] == 0, (t, res[t])
    # LAPACK factorizations: every GPU target refuses them by its capability record, and says so.
    res = opinfo_targets.sweep_entry(_cases("linalg.inv", 2), targets, str(tmp_path / "inv"))
    for t in targets:
        assert res[t]["accepted"] == 0 and res[t]["refused"] == 2 and res[t]["failed"] == 0, (t, res[t])
        assert "LAPACK" in res[t]["reason"], res[t]

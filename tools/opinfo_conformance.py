"""OpInfo conformance: every sample of PyTorch's OpInfo database, compiled with Chroma.

    .venv/bin/python tools/opinfo_conformance.py --dtypes all --markdown docs/ops.md     # the full run
    .venv/bin/python tools/opinfo_conformance.py [--ops REGEX] [--dtypes float32,int64,...]
                                                 [--max-samples N] [--json FILE] [--markdown FILE]
    .venv/bin/python tools/opinfo_conformance.py --from-json a.json,b.json --json all.json --markdown docs/ops.md
    .venv/bin/python tools/opinfo_conformance.py --from-json docs/ops.md,half.json --markdown docs/ops.md
                                                 (an earlier table, with a newer run's rows in place of its own)
    .venv/bin/python tools/opinfo_conformance.py --targets webgpu,cuda,metal --json build/targets.json
    .venv/bin/python tools/opinfo_conformance.py --from-json docs/ops.md,build/targets.json --markdown docs/ops.md
                                                 (the per-target columns: what each GPU target compiles)

For each OpInfo (torch.testing._internal.common_methods_invocations.op_db; needs the
`expecttest` package) and each requested dtype it supports on the CPU, every sample input is
wrapped as a function of its tensors (other arguments are baked in), compiled with
chroma.compile and run; each output is compared with eager PyTorch using
torch.testing.assert_close's default tolerances for the dtype (float32: rtol 1.3e-6,
atol 1e-5, or the entry's own OpInfo tolerance overrides), NaNs equal; singular and eigen
vectors in a canonical sign (CANONICAL). To keep compile time down, all samples of one (op, dtype) are
compiled into one program first; when that fails, each sample is compiled on its own so every
failure gets its own reason.

Families left out on purpose (named in the report): random-number ops (their results depend
on the generator), ops that return uninitialized memory, and ops with no CPU kernel.

Each sample ends as `pass`, `fail` (compiled but wrong, or failed at run time), or
`unsupported` (rejected at export or compile time, with the message). The JSON report lists
them all.

--targets compiles every entry's float32 samples for each GPU target named instead
(opinfo_targets.py: accepted, refused by the target's capability record with its reason, or
failed); merged into docs/ops.md it becomes a column per target.

The parts: opinfo_cases.py (samples, tolerances, running and judging them), opinfo_report.py
(docs/ops.md and merging reports), opinfo_targets.py (the per-target sweep); this file is the
command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
import traceback

from opinfo_cases import ALL_DTYPES, DTYPES, Case, excluded, run_cases, tolerances
from opinfo_report import merge_reports, write_markdown

__all__ = ["Case", "run_cases", "tolerances", "main"]


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="", help="regular expression over OpInfo names")
    ap.add_argument("--dtypes", default="float32", help=f"comma-separated, or all ({ALL_DTYPES})")
    ap.add_argument("--max-samples", type=int, default=0, help="samples per (op, dtype); 0: all")
    ap.add_argument("--json", default=os.path.join("build", "opinfo.json"))
    ap.add_argument("--markdown", default="", help="also write the coverage table (docs/ops.md)")
    ap.add_argument("--from-json", default="",
                    help="write --markdown from earlier reports (comma-separated; a .md: an earlier docs/ops.md), run nothing")
    ap.add_argument("--shard", default="", help="K/N: only every N-th entry of op_db, from the K-th (parallel runs)")
    ap.add_argument("--note", default="", help="a paragraph placed under the header of --markdown")
    ap.add_argument("--targets", default="",
                    help="comma-separated GPU targets: compile each entry's float32 samples for them (no CPU run)")
    return ap.parse_args(argv)


def _entry_cases(op, dtypes, max_samples, entry):
    """[(dtype name, cases, bad)] for the dtypes of `dtypes` the entry supports on the CPU;
    `bad` are the samples that are not dense tensors ((text, reason)). A dtype whose samples
    cannot be generated gets an error row in `entry`."""
    supported = op.supported_dtypes("cpu")
    per_dtype = []
    for dt in dtypes:
        dname = str(dt).replace("torch.", "")
        if dt not in supported:
            continue
        try:
            samples = list(op.sample_inputs("cpu", dt, requires_grad=False))
        except Exception as e:  # noqa: BLE001
            entry["dtypes"][dname] = {"error": f"sample generation: {e}"}
            continue
        if max_samples:
            samples = samples[:max_samples]
        tol = tolerances(op, dt)
        cases, bad = [], []
        for smp in samples:
            try:
                cases.append(Case(op, smp, tol))
            except Exception as e:  # noqa: BLE001 - e.g. sparse inputs: not a dense tensor
                bad.append((repr(smp)[:160], f"input: {type(e).__name__}: {e}"[:300]))
        per_dtype.append((dname, cases, bad))
    return per_dtype


def _run_entry(full, per_dtype, work, cache, entry):
    """Runs an entry's samples of every dtype (one program first; run_cases falls back to one
    per dtype, then per sample) and records them in `entry`."""
    flat, groups = [], []
    for _, cases, _ in per_dtype:
        groups.append(list(range(len(flat), len(flat) + len(cases))))
        flat.extend(cases)
    try:
        probe = [k for k, (dname, _, _) in enumerate(per_dtype) if dname == "bfloat16"]
        res_all = run_cases(flat, work, cache, groups, probe) if flat else []
    except Exception:  # noqa: BLE001 - the runner itself must not stop
        res_all = [("fail", "runner: " + traceback.format_exc(limit=2)[-300:])] * len(flat)
    for (dname, cases, bad), idx in zip(per_dtype, groups):
        res = [res_all[i] for i in idx]
        # Samples whose inputs are not dense strided tensors (sparse layouts): unsupported.
        res = res + [("unsupported", why) for _, why in bad]
        cases = cases + [type("Bad", (), {"text": text})() for text, _ in bad]
        entry["dtypes"][dname] = {"samples": [{"sample": c.text, "status": s, "reason": r}
                                              for c, (s, r) in zip(cases, res)]}
        counts = {k: sum(1 for s, _ in res if s == k) for k in ("pass", "fail", "unsupported", "skip")}
        print(f"{full:40s} {dname:9s} " + " ".join(f"{k} {v}" for k, v in counts.items() if v), flush=True)


def _write(report, path, t0):
    # Written after every entry, so a run that is stopped keeps what it measured.
    report["seconds"] = round(time.time() - t0, 1)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def _sweep(a, dtypes, targets):
    """Every selected entry of op_db run (or, with targets, compiled for them); the report."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    import opinfo_targets

    pat = re.compile(a.ops) if a.ops else None
    report = {"torch": torch.__version__, "dtypes": a.dtypes.split(","), "max_samples": a.max_samples, "ops": []}
    if targets:  # no CPU rows: merged into a table, it adds the target columns only
        report = dict(report, dtypes=[], targets={t: {} for t in targets})
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="chroma-opinfo-") as tmp:
        cache = os.path.join(tmp, "cache")
        shard_k, shard_n = (int(v) for v in a.shard.split("/")) if a.shard else (0, 1)
        for pos, op in enumerate(op_db):
            full = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
            if (pat and not pat.search(full)) or pos % shard_n != shard_k:
                continue
            entry = {"name": full, "aten_name": op.aten_name, "dtypes": {}}
            why = excluded(op)
            if why:
                if not targets:
                    report["ops"].append(dict(entry, excluded=why))
                continue
            per_dtype = _entry_cases(op, dtypes, a.max_samples, entry)
            work = os.path.join(tmp, re.sub(r"\W", "_", full))
            if targets:
                cases = [c for dname, cs, _ in per_dtype if dname == "float32" for c in cs]
                if cases:
                    res = opinfo_targets.sweep_entry(cases, targets, work)
                    for t in targets:
                        report["targets"][t][full] = res[t]
                    print(f"{full:40s} " + " ".join(f"{t} {opinfo_targets.cell(res[t])}" for t in targets), flush=True)
            else:
                _run_entry(full, per_dtype, work, cache, entry)
                report["ops"].append(entry)
            _write(report, a.json, t0)
    _write(report, a.json, t0)
    return report


def main(argv=None):
    a = _args(argv)
    if a.from_json:
        merged = merge_reports(a.from_json.split(","))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(merged, f, indent=1)
        write_markdown(merged, a.markdown or os.path.join("docs", "ops.md"), a.note)
        return
    os.environ.setdefault("CHROMA_NUM_THREADS", "1")
    import torch

    targets = [t for t in a.targets.split(",") if t]
    if targets:
        a.dtypes = "float32"
    if a.dtypes == "all":
        a.dtypes = ALL_DTYPES
    dtypes = [getattr(torch, DTYPES[d]) for d in a.dtypes.split(",")]
    report = _sweep(a, dtypes, targets)
    print(f"report: {a.json} ({report['seconds']} s)")
    if a.markdown and not targets:
        write_markdown(report, a.markdown, a.note)
        print(f"wrote {a.markdown}")


if __name__ == "__main__":
    main()

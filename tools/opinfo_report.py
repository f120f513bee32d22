"""docs/ops.md: the OpInfo conformance report as a table, and reports merged into one.

write_markdown(report, path) writes the coverage document (summary by cause, the core ATen
opset, one row per OpInfo entry and dtype, the per-target columns when the report has a
target sweep, the excluded entries); report_from_markdown reads such a document back as a
report, so that a new run can replace some of its rows (merge_reports) without re-running the
rest. A report is the JSON tools/opinfo_conformance.py writes: {"torch", "dtypes", "runs",
"seconds", "ops": [{"name", "dtypes": {dtype: {"samples": [{"status", "reason"}], "run"}}}],
"targets": {target: {entry: {"accepted", "refused", "reason"}}}}."""

from __future__ import annotations

import json
import os
import re
import warnings

import opinfo_targets
from opinfo_cases import DTYPES, HERE, excluded_name

# ---- docs/ops.md ---------------------------------------------------------------------------

# Core ATen ops that map onto one IR primitive of the same meaning (elementwise ops are
# Map; the others are named). Every other handled op is a decomposition into several.
STRUCTURAL_NATIVE = {
    "aten.permute.default": "Permute", "aten.expand.default": "Expand", "aten.slice.Tensor": "Slice",
    "aten.view.default": "Reshape", "aten.flip.default": "Flip", "aten.cat.default": "Concat",
    "aten.mm.default": "MatMul", "aten.bmm.default": "MatMul", "aten.convolution.default": "Conv",
    "aten.gather.default": "GatherElements", "aten.index_select.default": "Gather", "aten.topk.default": "TopK",
    "aten.sum.dim_IntList": "Reduce", "aten.amax.default": "Reduce", "aten.amin.default": "Reduce",
    "aten.prod.dim_int": "Reduce", "aten.argmax.default": "ArgReduce", "aten.argmin.default": "ArgReduce",
    "aten._softmax.default": "Softmax", "aten._log_softmax.default": "Softmax", "aten._to_copy.default": "Cast",
    "aten.full.default": "Full", "aten.arange.start_step": "Iota", "aten.index_put.default": "IndexPut",
    "aten.cumsum.default": "Scan", "aten.scatter_add.default": "IndexPut",
}


def _elementwise_names():
    path = os.path.join(HERE, "..", "include", "chroma", "elementwise.def")
    names = set()
    with open(path) as f:
        for line in f:
            m = re.match(r"CHROMA_EW\((\w+)", line)
            if m:
                names.add(m.group(1))
    return names


def core_table():
    """(op, how, detail) for every core ATen op in tests/data/core_aten_ops.tsv."""
    from chroma import _compiler

    handled = set(_compiler.supported_aten_targets())
    refusal = getattr(_compiler, "refusal", None)
    ew = _elementwise_names()
    rows = []
    with open(os.path.join(HERE, "..", "tests", "data", "core_aten_ops.tsv")) as f:
        core = [line.split("\t")[0] for line in f if line.startswith("aten.")]
    for op in core:
        why = refusal(op) if refusal else ""
        base = op.split(".")[1]
        if op in handled:
            if op in STRUCTURAL_NATIVE:
                rows.append((op, "native", STRUCTURAL_NATIVE[op]))
            elif base in ew:
                rows.append((op, "native", "Map." + base))
            else:
                rows.append((op, "decomposition", ""))
        elif why:
            rows.append((op, "refused", why))
        else:
            rows.append((op, "not yet", ""))
    return rows


def cause(sample):
    """A short cause for a failing sample's reason (the summary table of docs/ops.md)."""
    if sample is None:
        return "no sample ran (eager raises on every one)"
    if sample.get("cause"):  # read back from an earlier table (report_from_markdown)
        return sample["cause"]
    r = sample["reason"]
    if sample["status"] == "fail":
        return "compiles, result differs or run-time error"
    if re.search(r"complex|_fft_", r):
        return "*by design*: complex numbers"
    if re.search(r"data-dependent|DataDependent|DynamicOutputShape|GuardOnDataDependent", r):
        return "*by design*: data-dependent output shape"
    if re.search(r"sparse|layout", r, re.I):
        return "*by design*: sparse tensors"
    if re.search(r"uint64|uint16|uint32", r):
        return "dtype without a Chroma type (unsigned 16-64 bit)"
    if r.startswith("op "):
        return "ATen op without a handler"
    if r.startswith("export:"):
        return "refused at export"
    return "refused at compile time (argument combination)"


def _random_sample(smp):
    """A sample Chroma refuses because it draws random numbers (dropout with p > 0 inside an
    entry that is otherwise deterministic, such as attention with dropout_p): it belongs to the
    excluded random-number family and is skipped, not counted against the entry."""
    return smp["status"] == "unsupported" and "random-number ops are not supported" in smp.get("reason", "")


def report_from_markdown(path):
    """An earlier docs/ops.md read back as a merged report, so that a new run (say, of the
    half types only) can be merged into it with --from-json without re-running the rest. Each
    row keeps its run, its counts and its first reason: its samples are that many passes, then
    that many failures (or refusals) with the row's reason, which is all the table and its
    summary are made of. (Samples skipped as random are not in the table and come back as
    nothing.)"""
    report = {"ops": [], "runs": [], "dtypes": [], "torch": "", "seconds": 0.0}
    by, causes, targets, by_target = {}, {}, [], []
    row = re.compile(r"^\| (\S+) \| (r\d+) \| (\w+) \| (\d*) \| (\d*) \| (\d*) \| (.*) \|$")
    section = ""
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("## "):
                section = line[3:]
                continue
            m = re.match(r"^torch (\S+); merged from \d+ runs .*?, (\d+) min of runner time", line)
            if m:
                report["torch"], report["seconds"] = m.group(1), 60.0 * float(m.group(2))
            m = re.match(r"^- (r\d+): dtypes ([\w, ]+); (at most (\d+) samples|every sample)[^;]*; torch (\S+)\.$", line)
            if m:
                report["runs"].append({"tag": m.group(1), "dtypes": m.group(2).split(", "),
                                       "max_samples": int(m.group(4) or 0), "torch": m.group(5)})
                continue
            m = re.match(r"^\| (.+?) \| \d+ \| (.+) \|$", line)
            if section == "Summary" and m and m.group(1) != "cause":
                for n in m.group(2).split(", "):
                    causes[n] = m.group(1)  # the float32 cause, classified from the full reason
                continue
            if section == "By target":
                by_target.append(line)
            if section == "Per OpInfo entry":
                if line.startswith("| OpInfo | run | dtype |"):  # the target columns, if any
                    targets = [c.strip() for c in line.strip("|").split("|")][6:-1]
                    report["targets"] = {t: {} for t in targets}
                    row = re.compile(r"^\| (\S+) \| (r\d+) \| (\w+) \| (\d*) \| (\d*) \| (\d*) \| "
                                     + "([^|]*) \| " * len(targets) + r"(.*) \|$")
                m = row.match(line)
                if not m:
                    continue
                name, run, dt, p, fl, un = m.groups()[:6]
                reason = m.groups()[-1]
                for t, text in zip(targets, m.groups()[6:-1]):
                    c = opinfo_targets.read_cell(text)
                    if c is not None:
                        report["targets"][t][name] = c
                o = by.get(name)
                if o is None:
                    o = by[name] = {"name": name, "dtypes": {}, "run": run}
                    report["ops"].append(o)
                if p == "" and fl == "" and un == "":
                    o["dtypes"][dt] = {"error": reason, "run": run}
                    continue
                bad = {"status": "fail" if int(fl) else "unsupported", "reason": reason}
                if dt == "float32" and name in causes:
                    bad["cause"] = causes[name]
                o["dtypes"][dt] = {"samples": [{"status": "pass", "reason": ""}] * int(p) + [bad] * (int(fl) + int(un)),
                                   "run": run}
            elif section == "Excluded on purpose":
                m = re.match(r"^\| (\S+) \| (.+) \|$", line)
                if m and m.group(1) != "OpInfo" and not m.group(1).startswith("---"):
                    report["ops"].append({"name": m.group(1), "dtypes": {}, "excluded": m.group(2),
                                          "run": report["runs"][-1]["tag"] if report["runs"] else "r1"})
    if not report["runs"]:
        raise SystemExit(f"{path}: no run list found (not a merged docs/ops.md?)")
    opinfo_targets.read_section(by_target, report)
    # Entries of op_db with no row ran with none of their dtypes among those asked for.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.testing._internal.common_methods_invocations import op_db
        named = {o["name"] for o in report["ops"]}
        for op in op_db:
            full = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
            if full not in named:
                report["ops"].append({"name": full, "dtypes": {}, "run": report["runs"][-1]["tag"]})
    except ImportError:
        pass
    report["dtypes"] = sorted({d for run in report["runs"] for d in run["dtypes"]}, key=lambda d: list(DTYPES).index(d))
    return report


def _counts(o, dt):
    c = {"pass": 0, "fail": 0, "unsupported": 0, "skip": 0}
    for smp in o["dtypes"].get(dt, {}).get("samples", []):
        c[smp["status"]] += 1
    return c


def _all_pass(o, dt):
    c = _counts(o, dt)
    return c["pass"] > 0 and c["fail"] == 0 and c["unsupported"] == 0


def _summary(report, note):
    """The header and the Summary section: pass counts per dtype, float32 failures by cause,
    the runs merged."""
    ops = report["ops"]
    excluded = [o for o in ops if o.get("excluded")]
    f32_all = [o for o in ops if "float32" in o.get("dtypes", {}) and "samples" in o["dtypes"]["float32"]]
    # Entries where eager itself raises on every float32 sample (CUDA-only jiterator entries)
    # or returns no tensor (item, equal, allclose) have nothing to compare: listed, not counted.
    f32 = [o for o in f32_all if any(x["status"] != "skip" for x in o["dtypes"]["float32"]["samples"])]
    nothing = [o["name"] for o in f32_all if o not in f32]
    passing = [o for o in f32 if _all_pass(o, "float32")]
    rate = 100.0 * len(passing) / max(1, len(f32))
    lines = ["# Op coverage", "",
             "Generated by `tools/opinfo_conformance.py --dtypes all --markdown docs/ops.md` (do not edit by hand; "
             "README.md, Op coverage).", "",
             (f"torch {report['torch']}; merged from {len(report['runs'])} runs (listed in the summary), "
              f"{report.get('seconds', 0) / 60:.0f} min of runner time in all." if report.get("runs") else
              f"torch {report['torch']}; dtypes {', '.join(report['dtypes'])}; "
              f"{'at most ' + str(report['max_samples']) + ' samples per op and dtype' if report.get('max_samples') else 'every sample'}; "
              f"{report.get('seconds', 0) / 60:.0f} min."), ""] + ([note, ""] if note else []) + [
             "## Summary", "",
             f"- OpInfo entries in PyTorch's database: {len(ops)}; excluded on purpose: {len(excluded)} "
             "(random-number ops, ops returning uninitialized memory; listed at the end).",
             f"- Entries with float32 samples on the CPU: {len(f32)}; passing every float32 sample: "
             f"**{len(passing)} ({rate:.1f}%)**."]
    if nothing:
        lines.append(f"- Entries whose every float32 sample eager itself rejects (GPU-only jiterator entries) or "
                     f"answers with a Python value instead of a tensor: {len(nothing)} ({', '.join(nothing)}); not "
                     "counted above.")
    for dt in report["dtypes"]:
        if dt == "float32":
            continue
        have = [o for o in ops if "samples" in o.get("dtypes", {}).get(dt, {})]
        ok = [o for o in have if _all_pass(o, dt)]
        lines.append(f"- Entries with {dt} samples: {len(have)}; passing every {dt} sample: {len(ok)}.")
    # Why the others do not pass: the first failing float32 sample's reason, by cause.
    causes = {}
    for o in f32:
        if _all_pass(o, "float32"):
            continue
        smp = o["dtypes"]["float32"]["samples"]
        first = next((x for x in smp if x["status"] in ("fail", "unsupported")), None)
        causes.setdefault(cause(first), []).append(o["name"])
    if causes:
        lines += ["", "Entries that do not pass every float32 sample, by the cause of the first sample that "
                  "does not (*by design*: Chroma refuses these at compile time with the reason):", "",
                  "| cause | entries | names |", "|---|---:|---|"]
        for k, names in sorted(causes.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"| {k} | {len(names)} | {', '.join(names)} |")
        design = sum(len(v) for k, v in causes.items() if k.startswith("*by design*"))
        lines += ["", f"Not counting the {design} entries refused by design, {len(passing)} of {len(f32) - design} "
                  f"entries pass every float32 sample ({100.0 * len(passing) / max(1, len(f32) - design):.1f}%)."]
    not_run = [o["name"] for o in ops if o.get("not_run")]
    if not_run:
        lines.append(f"- Entries not run by any of the merged reports: {len(not_run)} ({', '.join(not_run)}).")
    if report.get("runs"):
        lines += ["", "This table merges several runs (the `run` column says which one an entry's row comes from; "
                  "a later run replaces an earlier one's row):", ""]
        for run in report["runs"]:
            cap = f"at most {run['max_samples']} samples per entry and dtype" if run["max_samples"] else "every sample"
            lines.append(f"- {run['tag']}: dtypes {', '.join(run['dtypes'])}; {cap}; torch {run['torch']}.")
    return lines + ["", METHOD]


METHOD = ("A sample passes when Chroma's outputs equal eager PyTorch's within the entry's "
          "tolerances, NaNs equal: `torch.testing.assert_close`'s defaults for the dtype (float32: "
          "rtol 1.3e-6, atol 1e-5; integer and bool results exactly), widened where the OpInfo entry declares "
          "a tolerance override for one of PyTorch's own forward-comparison tests on the CPU "
          "(TestCommon, TestDecomp, TestInductorOpInfo; gradient tests do not count). Singular and "
          "eigen vectors (svd, linalg.svd, linalg.eigh) are unique only up to sign, so both sides are "
          "compared in a canonical form: each vector's largest entry made positive (flipping its "
          "partner too), and the extra columns of full U/V, a basis fixed only up to rotation, "
          "compared by their projector. The indices of sort (without stable=True) and topk are "
          "compared with each run of equal values' indices in ascending order (PyTorch leaves "
          "their order unspecified; topk with sorted=False: the pairs in value order). `unsupported` "
          "means export or compilation refused it with the message shown; `fail` means it compiled "
          "and gave a different answer or failed at run time. Random-number ops (their results "
          "depend on the generator: this includes fractional max pooling and the randomized "
          "low-rank SVD/PCA, and single samples that draw random numbers, such as attention with "
          "dropout_p > 0, which count as skipped) and ops returning uninitialized memory are "
          "excluded; entries with no "
          "CPU kernel for a dtype have no row for it.")


def _core_lines():
    lines = ["## Core ATen opset", ""]
    core = core_table()
    by = {}
    for _, how, _ in core:
        by[how] = by.get(how, 0) + 1
    lines.append(f"{len(core)} core ATen ops (`tests/data/core_aten_ops.tsv`): "
                 + ", ".join(f"{v} {k}" for k, v in sorted(by.items())) + ". Native: the op is one IR "
                 "primitive of the same meaning; decomposition: several primitives; refused: the compiler "
                 "rejects it by design with the reason shown (at export, naming the node and source line).")
    lines += ["", "| core ATen op | handled | detail |", "|---|---|---|"]
    for op, how, detail in core:
        lines.append(f"| `{op}` | {how} | {detail.replace('|', '/')} |")
    return lines


def _entry_lines(report):
    """The Per OpInfo entry table (a column per GPU target when the report has a target sweep:
    its float32 rows) and the Excluded section."""
    targets = list(report.get("targets") or {})
    head = "| OpInfo | run | dtype | pass | fail | unsupported | " + "".join(f"{t} | " for t in targets) + "first reason |"
    lines = ["## Per OpInfo entry", "", head, "|---|---|---|---:|---:|---:|" + "---:|" * len(targets) + "---|"]
    for o in report["ops"]:
        if o.get("excluded"):
            continue
        for dt, d in o.get("dtypes", {}).items():
            run = d.get("run", o.get("run", ""))
            cells = "".join(f"{opinfo_targets.cell(report['targets'][t].get(o['name'])) if dt == 'float32' else ''} | "
                            for t in targets)
            if "samples" not in d:
                lines.append(f"| {o['name']} | {run} | {dt} | | | | {cells}{d.get('error', '')[:150]} |")
                continue
            c = _counts(o, dt)
            reason = next((smp["reason"] for smp in d["samples"] if smp["status"] in ("fail", "unsupported")), "")
            reason = " ".join(reason.split())[:160].replace("|", "/")
            lines.append(f"| {o['name']} | {run} | {dt} | {c['pass']} | {c['fail']} | {c['unsupported']} | {cells}{reason} |")
    lines += ["", "## Excluded on purpose", "", "| OpInfo | why |", "|---|---|"]
    for o in report["ops"]:
        if o.get("excluded"):
            lines.append(f"| {o['name']} | {o['excluded']} |")
    return lines


def write_markdown(report, path, note=""):
    for o in report["ops"]:
        for d in o.get("dtypes", {}).values():
            for smp in d.get("samples", []):
                if _random_sample(smp):
                    smp["status"], smp["reason"] = "skip", "draws random numbers: " + smp["reason"]
    lines = _summary(report, note) + [""] + _core_lines() + opinfo_targets.section(report) + [""] + _entry_lines(report)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _read_report(path):
    if path.endswith(".md"):
        return report_from_markdown(path)
    with open(path) as f:
        return json.load(f)


def _op_db_order():
    """{entry name: its position in op_db}, or None without PyTorch's test database."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.testing._internal.common_methods_invocations import op_db
    except ImportError:
        return None
    return {o.name + ("." + o.variant_test_name if o.variant_test_name else ""): i for i, o in enumerate(op_db)}


def merge_reports(paths):
    """Several reports (parallel shards, a re-run, a target sweep; a .md: an earlier
    docs/ops.md) as one: a later report's results for an entry and dtype replace earlier ones
    (its other dtypes keep theirs, each row naming its own run), and so do its per-target
    counts; op_db order is kept. An input that is itself a merged report keeps its runs
    (renumbered after the earlier inputs'); a plain report is one run (a target sweep alone,
    which has no CPU rows, adds none)."""
    merged, order, seconds, runs, by, targets, samples = None, [], 0.0, [], {}, {}, []
    for path in paths:
        r = _read_report(path)
        if r.get("ops"):  # (a target sweep's time is not the CPU runs' runner time)
            seconds += r.get("seconds", 0)
        for t, counts in (r.get("targets") or {}).items():
            targets.setdefault(t, {}).update(counts)
        if r.get("targets_samples"):  # an earlier table's account of its sweeps
            samples.append(r["targets_samples"])
        elif r.get("targets"):
            n = len(next(iter(r["targets"].values())))
            cap = f"at most {r['max_samples']}" if r.get("max_samples") else "every"
            samples.append(f"{cap} float32 sample{'s' if cap != 'every' else ''} of each of {n} entries "
                           f"(one sweep, torch {r.get('torch', '')})")
        if merged is None:
            merged = dict(r, ops=[])
        if not r.get("ops"):
            continue
        sub = r.get("runs") or [{"tag": None, "dtypes": r["dtypes"], "max_samples": r.get("max_samples", 0),
                                 "torch": r.get("torch", "")}]
        retag = {}
        for run in sub:
            retag[run["tag"]] = f"r{len(runs) + 1}"
            runs.append(dict(run, tag=retag[run["tag"]]))
        for o in r["ops"]:
            if o.get("not_run"):
                continue
            if o["name"] not in by:
                order.append(o["name"])
            tag = retag.get(o.get("run") if r.get("runs") else None, runs[-1]["tag"])
            dts = {dt: dict(d, run=retag.get(d["run"], tag) if "run" in d and r.get("runs") else tag)
                   for dt, d in o.get("dtypes", {}).items()}
            old = by.get(o["name"])
            if old is not None and not old.get("excluded") and not o.get("excluded"):
                dts = {**old.get("dtypes", {}), **dts}
            by[o["name"]] = dict(o, run=tag, dtypes=dts)
            why = excluded_name(o["name"])  # today's exclusion rules apply to older reports too
            if why and not by[o["name"]].get("excluded"):
                by[o["name"]] = {"name": o["name"], "dtypes": {}, "excluded": why, "run": tag}
    merged["runs"] = runs
    merged["dtypes"] = sorted({d for run in runs for d in run["dtypes"]}, key=lambda d: list(DTYPES).index(d))
    rank = _op_db_order()
    if rank is not None:  # op_db order, as a single run writes it
        for n in rank:  # entries none of the reports ran
            if n not in by:
                order.append(n)
                by[n] = {"name": n, "dtypes": {}, "not_run": True}
        order.sort(key=lambda n: rank.get(n, len(rank)))
    merged["ops"] = [by[n] for n in order]
    merged["seconds"] = seconds
    merged["targets"] = targets
    merged["targets_samples"] = "; ".join(samples)
    return merged

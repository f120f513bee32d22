"""The per-target columns of docs/ops.md: which OpInfo samples each GPU target compiles.

tools/opinfo_conformance.py --targets webgpu,cuda,metal exports each entry's samples once and
compiles the graph for every target named, up to its kernels' text (the target's lowering
options, its capability check, the GPU generator with its dialect and capability record; the
package writer and the CUDA/Metal emulator library, which the op suites exercise, are left
out). A target either generates every kernel (`accepted`), refuses the program by its own
capability answer (Target::supports, raised as chroma.UnsupportedError with one reason per
refused part) or the compiler refuses the program for every target (a CompileError naming the
node: `refused`, the first reason kept), or it fails in another way (an internal error or any
other exception: `failed`, the message kept, a defect to fix). Samples that do not
export are not counted (the CPU columns already say why). Numerics on each target are the GPU
op suites' job (tests/python, CHROMA_TEST_TARGET), not this sweep's: a target's column says what
it compiles, over the same samples as the CPU's.

As in run_cases, all samples of an entry go into one program first; when a target does not
accept it, each sample is compiled on its own for that target, so every refusal is counted
and named."""

from __future__ import annotations

import os
import re
import warnings

from opinfo_cases import _outputs


def _export(cases, idx, path):
    """Exports the samples `idx` of `cases` as one graph file; returns the error, or None."""
    import chroma

    offsets, flat = [], []
    for i in idx:
        offsets.append(len(flat))
        flat.extend(cases[i].leaves)

    def fn(*ts):
        outs = []
        for i, off in zip(idx, offsets):
            outs.extend(_outputs(cases[i].call(*ts[off:off + len(cases[i].leaves)])))
        return tuple(outs)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            chroma.export(fn, tuple(flat), path)
        return None
    except Exception as e:  # noqa: BLE001 - the sample is not counted for any target
        return e


def _build(gpath, target):
    """("accepted" | "refused" | "failed", reason) of compiling the graph for `target`: the
    target's own lowering options, its capability check and its code generator with its
    dialect and capability record (chroma._compiler.gpu_kernel_sources, in process; no package
    is written and no emulator library built)."""
    import chroma
    from chroma import _compiler

    try:
        _compiler.gpu_kernel_sources(gpath, target)  # (a program of views only has no kernel)
        return "accepted", ""
    except chroma.UnsupportedError as e:
        reasons = [r[3] for r in getattr(e, "refusals", [])] or [str(e)]
        return "refused", " ".join(reasons[0].split())[:200]
    except chroma.CompileError as e:
        # The compiler's own refusal of the program, naming its node (the CPU refuses it too,
        # or the sample draws random numbers): refused; an internal error is a defect.
        msg = " ".join(str(e).split())
        if "internal" not in msg:
            return "refused", re.sub(r" at \S+:\d+ in \w+:.*?(?=: |$)", "", msg)[:200]
        return "failed", "CompileError: " + msg[:200]
    except Exception as e:  # noqa: BLE001 - a defect of the target: counted, with its message
        return "failed", f"{type(e).__name__}: " + " ".join(str(e).split())[:200]


def sweep_entry(cases, targets, workdir):
    """{target: {"accepted": n, "refused": n, "failed": n, "reason": first refusal or failure}}
    over the samples of one entry that export (others are not counted)."""
    os.makedirs(workdir, exist_ok=True)
    result = {t: {"accepted": 0, "refused": 0, "failed": 0, "reason": ""} for t in targets}
    if not cases:
        return result
    every = list(range(len(cases)))
    gall = os.path.join(workdir, "all.cgraph")
    together = _export(cases, every, gall) is None if len(cases) > 1 else False
    singles = {}  # sample -> its graph file, or None when it does not export

    def single(i):
        if i not in singles:
            path = os.path.join(workdir, f"s{i}.cgraph")
            singles[i] = path if _export(cases, [i], path) is None else None
        return singles[i]

    for t in targets:
        r = result[t]
        if together and _build(gall, t)[0] == "accepted":
            r["accepted"] = len(cases)
            continue
        for i in every:
            g = single(i)
            if g is None:
                continue
            status, why = _build(g, t)
            r[status] += 1
            if why and not r["reason"]:
                r["reason"] = why
    return result


def cell(counts):
    """A per-target cell of docs/ops.md: `all n`, `k/n` (the others refused), `k/n, f fail`, or
    empty when no sample exported."""
    if counts is None:
        return ""
    n = counts["accepted"] + counts["refused"] + counts["failed"]
    if n == 0:
        return ""
    if counts["accepted"] == n:
        return f"all {n}"
    return f"{counts['accepted']}/{n}" + (f", {counts['failed']} fail" if counts["failed"] else "")


def read_cell(text):
    """The counts a cell stands for (the reasons live in the By target section)."""
    import re

    m = re.match(r"^(?:all (\d+)|(\d+)/(\d+)(?:, (\d+) fail)?)$", text.strip())
    if not m:
        return None
    if m.group(1):
        return {"accepted": int(m.group(1)), "refused": 0, "failed": 0, "reason": ""}
    k, n, f = int(m.group(2)), int(m.group(3)), int(m.group(4) or 0)
    return {"accepted": k, "refused": n - k - f, "failed": f, "reason": ""}


def section(report):
    """The By target section of docs/ops.md (lines), from report["targets"]."""
    targets = report.get("targets") or {}
    if not targets:
        return []
    lines = ["", "## By target", "",
             f"Each GPU target's column in the per-entry table counts the float32 samples it compiles "
             f"(`tools/opinfo_conformance.py --targets {','.join(targets)}`): `all n` when it builds every "
             "sample that exports, `k/n` when it refuses the others by its capability record, with the "
             "first reason below. The column says what a target compiles; its numerics are checked by "
             "its op suite (README.md, Testing). A sample counts as compiled when the target's lowering, "
             "capability check and code generator produce its kernels (WGSL, CUDA C++, MSL); writing the "
             "package, nvcc and the emulator's library are the op suites' part.", ""]
    if report.get("targets_samples"):
        lines += [f"Samples: {report['targets_samples']}", ""]
    lines += ["| target | entries compiled in full | entries with refusals | entries failing |",
              "|---|---:|---:|---:|"]
    for t, by in targets.items():
        full = sum(1 for c in by.values() if c["accepted"] and not c["refused"] and not c["failed"])
        ref = sum(1 for c in by.values() if c["refused"])
        bad = sum(1 for c in by.values() if c["failed"])
        lines.append(f"| {t} | {full} | {ref} | {bad} |")
    for t, by in targets.items():
        reasons = {}
        for name, c in by.items():
            if c["refused"] or c["failed"]:
                reasons.setdefault(c["reason"] or "(reason not kept)", []).append(name)
        if not reasons:
            continue
        lines += ["", f"{t}: entries with samples it does not compile, by the first reason:", "",
                  "| reason | entries | names |", "|---|---:|---|"]
        for why, names in sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"| {why.replace('|', '/')} | {len(names)} | {', '.join(names)} |")
    return lines


def read_section(lines, report):
    """The reasons of a By target section read back into report["targets"] (whose counts come
    from the per-entry table's cells), and its Samples line: `lines` are the section's lines."""
    import re

    names = report.get("targets") or {}
    target = None
    for line in lines:
        if line.startswith("Samples: "):
            report["targets_samples"] = line[len("Samples: "):]
            continue
        m = re.match(r"^(\w+): entries with samples it does not compile", line)
        if m:
            target = m.group(1)
            continue
        m = re.match(r"^\| (.+) \| \d+ \| (.+) \|$", line)
        if target and m and m.group(1) != "reason":
            for n in m.group(2).split(", "):
                c = names.get(target, {}).get(n)
                if c is not None:
                    c["reason"] = "" if m.group(1) == "(reason not kept)" else m.group(1)

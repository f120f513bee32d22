"""OpInfo conformance: every sample of PyTorch's OpInfo database, compiled with Chroma.

    .venv/bin/python tools/opinfo_conformance.py --dtypes all --markdown docs/ops.md     # the full run
    .venv/bin/python tools/opinfo_conformance.py [--ops REGEX] [--dtypes float32,int64,...]
                                                 [--max-samples N] [--json FILE] [--markdown FILE]
    .venv/bin/python tools/opinfo_conformance.py --from-json a.json,b.json --json all.json --markdown docs/ops.md
    .venv/bin/python tools/opinfo_conformance.py --from-json docs/ops.md,half.json --markdown docs/ops.md
                                                 (an earlier table, with a newer run's rows in place of its own)

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
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

RANDOM = re.compile(r"(^|[._])(rand|randn|randint|normal|bernoulli|multinomial|dropout|uniform|"
                    r"exponential|geometric|cauchy|log_normal|poisson|rrelu|fractional_max_pool|"
                    r"svd_lowrank|pca_lowrank)|_like_random", re.I)
UNINITIALIZED = re.compile(r"(^|[._])(empty|new_empty|empty_like|empty_strided|empty_permuted)$")

# --dtypes all: float32 plus the integer, bool and half types.
ALL_DTYPES = "float32,int64,int32,bool,uint8,bfloat16,float16"
DTYPES = {"float32": "float32", "float64": "float64", "int64": "int64", "int32": "int32", "bool": "bool",
          "uint8": "uint8", "bfloat16": "bfloat16", "float16": "float16"}


def _np(t):
    """A tensor as a NumPy array (bfloat16: ml_dtypes' type, which NumPy lacks)."""
    from chroma.arrays import to_numpy

    return to_numpy(t)


def excluded_name(name: str) -> str:
    if RANDOM.search(name):
        return "random-number op"
    if UNINITIALIZED.search(name.split(".")[0]) or UNINITIALIZED.search(name):
        return "returns uninitialized memory"
    return ""


def excluded(op) -> str:
    return excluded_name(op.name + ("." + op.variant_test_name if op.variant_test_name else ""))


# OpInfo's own tolerances: the toleranceOverride / precisionOverride decorators PyTorch's
# forward-comparison tests apply to the entry (CPU or any device). Gradient tests
# (TestOperators, TestGradients, TestCompositeCompliance's backward/forward-AD tests) are
# not comparisons of forward results and do not count.
FORWARD_TESTS = {
    ("TestCommon", "test_noncontiguous_samples"), ("TestCommon", "test_variant_consistency_eager"),
    ("TestCommon", "test_out"), ("TestCommon", "test_python_ref"), ("TestCommon", "test_python_ref_torch_fallback"),
    ("TestCommon", "test_python_ref_executor"), ("TestCommon", "test_compare_cpu"), ("TestDecomp", "test_comprehensive"),
    ("TestDecomp", "test_quick"), ("TestInductorOpInfo", "test_comprehensive"), ("TestConsistency", "test_output_match"),
}
DEFAULT_TOL = {"float32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7), "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}


def tolerances(op, dtype):
    """(rtol, atol) for samples of float `dtype` (a torch dtype): torch.testing's defaults,
    widened by the overrides the entry declares for its forward-comparison tests; None for
    other dtypes (torch.testing's defaults by result type)."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride

    name = str(dtype).replace("torch.", "")
    if name not in DEFAULT_TOL:
        # Integer and bool samples: integer results compare exactly, float results (sin of
        # an int64 tensor) at torch.testing's defaults for their type.
        return None
    rtol, atol = DEFAULT_TOL[name]
    for info in getattr(op, "decorators", ()):
        if (getattr(info, "cls_name", None), getattr(info, "test_name", None)) not in FORWARD_TESTS:
            continue
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        if getattr(info, "dtypes", None) and dtype not in info.dtypes:
            continue
        for dec in getattr(info, "decorators", ()):
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                rtol, atol = max(rtol, dec.d[dtype].rtol), max(atol, dec.d[dtype].atol)
            elif isinstance(dec, precisionOverride) and dtype in dec.d:
                atol = max(atol, dec.d[dtype])
    return rtol, atol


def _flatten(obj, leaves):
    """Replaces every tensor in a nested args structure by a placeholder index."""
    import torch

    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return ("__tensor__", len(leaves) - 1)
    if isinstance(obj, (list, tuple)):
        out = [_flatten(o, leaves) for o in obj]
        return out if isinstance(obj, list) else tuple(out)
    if isinstance(obj, dict):
        return {k: _flatten(v, leaves) for k, v in obj.items()}
    return obj


def _rebuild(obj, tensors):
    if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == "__tensor__":
        return tensors[obj[1]]
    if isinstance(obj, list):
        return [_rebuild(o, tensors) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_rebuild(o, tensors) for o in obj)
    if isinstance(obj, dict):
        return {k: _rebuild(v, tensors) for k, v in obj.items()}
    return obj


def _outputs(res):
    import torch

    if isinstance(res, torch.Tensor):
        return [res]
    if isinstance(res, (list, tuple)) and all(isinstance(r, torch.Tensor) for r in res):
        return list(res)
    raise TypeError(f"non-tensor output {type(res).__name__}")


def _sign_canon(vecs, others=()):
    """Flips each column j of `vecs` (and of every tensor in `others`, whose column j goes
    with it) so that the column's largest-magnitude entry (the first, on ties) is positive."""
    import torch

    if vecs.numel() == 0:
        return vecs, list(others)
    i = vecs.abs().argmax(dim=-2, keepdim=True)
    sgn = torch.gather(vecs, -2, i).sign()
    sgn = torch.where(sgn == 0, torch.ones_like(sgn), sgn)
    return vecs * sgn, [o * sgn for o in others]


def _canon_svd(outs, vh):
    """Singular vectors are unique only up to a common sign per pair (u_j, v_j), and the
    columns past min(m, n) of a full U or V only up to a rotation of the space they span:
    compare sign-normalized pairs, and those spaces by their projectors."""
    u, s, v = outs
    if vh:
        v = v.mT
    k = s.shape[-1]
    u1, (v1,) = _sign_canon(u[..., :k], [v[..., :k]])
    res = [u1, s, v1]
    for m in (u, v):
        if m.shape[-1] > k:
            rest = m[..., k:]
            res.append(rest @ rest.mT)
    return res


def _canon_eigh(outs):
    """Eigenvectors of a symmetric matrix are unique only up to sign (for distinct eigenvalues)."""
    lam, q = outs
    return [lam, _sign_canon(q)[0]]


def _canon_ties(outs, dim, unordered):
    """(values, indices) of a sort or top-k whose order among equal values is unspecified
    (torch.sort without stable=True, torch.topk): the indices of each run of equal values
    (NaNs equal) in ascending order; with `unordered` (topk's sorted=False, any order at all)
    the pairs sorted by value, then index. The values themselves are compared as they are."""
    import numpy as np
    import torch

    vals, idx = outs[0], outs[1]
    if vals.dim() == 0 or vals.numel() == 0:
        return list(outs)
    v = vals.movedim(dim, -1).float().numpy()
    ix = idx.movedim(dim, -1).numpy()
    order = np.empty(ix.shape, dtype=np.int64)
    for r in np.ndindex(*ix.shape[:-1]):
        row, irow = v[r], ix[r]
        if unordered:
            order[r] = np.lexsort((irow, row))
        else:
            same = (row[1:] == row[:-1]) | (np.isnan(row[1:]) & np.isnan(row[:-1]))
            order[r] = np.lexsort((irow, np.concatenate([[0], np.cumsum(~same)])))
    o = torch.from_numpy(order).movedim(-1, dim)
    return [torch.take_along_dim(vals, o, dim), torch.take_along_dim(idx, o, dim)] + list(outs[2:])


def _tie_canon(name, sample):
    """The canonical form for a sort/top-k sample whose tie order PyTorch leaves unspecified."""
    args, kw = tuple(sample.args), dict(sample.kwargs)
    if name == "sort":
        if kw.get("stable", False):
            return None  # a stable sort's order is specified: compared as it is
        dim = args[0] if args else kw.get("dim", -1)
        return lambda o: _canon_ties(o, dim, False)
    if name == "topk":
        dim = args[1] if len(args) > 1 else kw.get("dim", -1)
        ordered = args[3] if len(args) > 3 else kw.get("sorted", True)
        return lambda o: _canon_ties(o, dim, not ordered)
    if name == "mode":
        dim = args[0] if args else kw.get("dim", -1)
        keepdim = args[1] if len(args) > 1 else kw.get("keepdim", False)
        x = sample.input.detach().clone()
        return lambda o: _canon_mode(o, x, dim, keepdim)
    return None


def _canon_mode(outs, x, dim, keepdim):
    """torch.mode's index may point at any occurrence of the mode value (the CPU kernel sorts
    each row without a stable order, so eager returns an arbitrary one when the value repeats,
    as half types make likely): an index that points at an element equal to the returned
    value (NaNs equal) becomes the first such position; any other index is left as it is, so
    a wrong one still fails."""
    import torch

    vals, idx = outs[0], outs[1]
    if x.dim() == 0 or x.numel() == 0:
        return list(outs)
    d = dim % x.dim()
    v = vals if keepdim else vals.unsqueeze(d)
    i = idx if keepdim else idx.unsqueeze(d)
    hit = (x == v) | (x.isnan() & v.isnan())
    first = hit.int().argmax(d, keepdim=True)
    points = torch.take_along_dim(hit, i.clamp(0, x.shape[d] - 1), d) & (i >= 0) & (i < x.shape[d])
    canon = torch.where(points, first, i)
    return [vals, canon if keepdim else canon.squeeze(d)] + list(outs[2:])


# Entries whose outputs are defined only up to a sign (or a rotation): both Chroma's and
# eager's outputs are put into the canonical form above before they are compared (as
# PyTorch's own linalg tests compare reconstructions rather than the vectors themselves).
# sort and topk (_tie_canon): the order of equal values' indices is unspecified; mode
# (_canon_mode): which occurrence of the mode value its index points at.
CANONICAL = {
    "svd": lambda o: _canon_svd(o, vh=False),
    "linalg.svd": lambda o: _canon_svd(o, vh=True),
    "linalg.eigh": _canon_eigh,
}


class Case:
    """One sample as a function of its tensors."""

    def __init__(self, op, sample, tol=None):
        self.tol = tol  # (rtol, atol) or None: torch.testing's defaults
        full = op.name if not op.variant_test_name else f"{op.name}.{op.variant_test_name}"
        self.canon = CANONICAL.get(full) or _tie_canon(full, sample)
        self.leaves = []
        self.spec = _flatten((sample.input, tuple(sample.args), dict(sample.kwargs)), self.leaves)
        self.leaves = [t.detach().contiguous().clone() for t in self.leaves]
        self.op = op
        self.text = repr(sample)[:160]

    def call(self, *tensors):
        inp, args, kwargs = _rebuild(self.spec, list(tensors))
        return self.op.op(inp, *args, **kwargs)


def _torch(a):
    """A NumPy array as a tensor (ml_dtypes' bfloat16 through its bits)."""
    from chroma.arrays import from_numpy

    return from_numpy(a)


def _compare(got, want, tol=None, canon=None):
    import numpy as np
    import torch

    if len(got) != len(want):
        return f"{len(got)} outputs, eager gives {len(want)}"
    # (np.array, not ascontiguousarray, which would make 0-d arrays 1-d)
    got = [_torch(np.array(g, copy=True)) for g in got]
    want = [w.detach().contiguous() for w in want]
    if canon is not None:
        got, want = canon(got), canon(want)
    for i, (g, w) in enumerate(zip(got, want)):
        kw = {}
        if tol is not None and w.is_floating_point():
            kw = {"rtol": tol[0], "atol": tol[1]}
        try:
            torch.testing.assert_close(g, w, equal_nan=True, **kw)
        except AssertionError as e:
            return f"output {i}: " + " ".join(str(e).split())[:300]
    return ""


def _compare_exact(case, got, want):
    """For a float32 sample that fails the comparison with eager: whether Chroma is at least
    as close to the exact answer as eager's own float32 kernel is. The exact answer is eager
    in float64 (the sample's float32 tensors upcast); Chroma passes when it is within the
    tolerance of it, widened by eager's own largest float32 error. This is the comparison for
    kernels whose float32 arithmetic is less accurate than torch.testing's defaults assume,
    such as the CPU flash-attention kernel (its vectorized exp and running rescaling put its
    float32 outputs about 2e-5 from the float64 values on inputs of magnitude 9)."""
    import numpy as np
    import torch

    if not any(t.dtype == torch.float32 for t in case.leaves) or case.canon is not None:
        return False
    leaves64 = [t.double() if t.dtype == torch.float32 else t for t in case.leaves]
    try:
        with torch.no_grad():
            exact = _outputs(case.call(*leaves64))
    except Exception:  # noqa: BLE001 - no float64 kernel
        return False
    if len(exact) != len(want) or len(got) != len(want):
        return False
    rtol, atol = case.tol if case.tol is not None else (1.3e-6, 1e-5)
    for g, w, x in zip(got, want, exact):
        if not (w.is_floating_point() and x.dtype == torch.float64):
            return False
        g64 = torch.from_numpy(np.array(g, copy=True)).double()
        eager_err = (w.double() - x).abs().nan_to_num(0.0).max().item() if w.numel() else 0.0
        try:
            torch.testing.assert_close(g64, x, equal_nan=True, rtol=rtol, atol=atol + eager_err)
        except AssertionError:
            return False
    return True


def _classify(e: BaseException) -> tuple:
    from chroma.frontend.exporter import ExportError

    msg = " ".join(str(e).split())
    name = type(e).__name__
    if isinstance(e, ExportError) or name == "ExportError":
        return "unsupported", "export: " + msg[:300]
    if name == "CompileError":
        m = re.search(r"unsupported ops?:\s*(\S+)", msg)
        if m:
            return "unsupported", "op " + m.group(1)
        return "unsupported", "compile: " + msg[:300]
    return "fail", f"{name}: {msg[:300]}"


CHUNK = 48


def run_cases(cases, workdir, cache, groups=None, probe=None):
    """Returns one (status, reason) per case. Compiles one program for all cases first; when
    that fails, one per group (`groups`: lists of case indices, e.g. one per dtype), then
    one per sample, so every failure gets its own reason."""
    import chroma
    import torch

    wants = []
    for c in cases:
        with torch.no_grad():
            try:
                wants.append(_outputs(c.call(*c.leaves)))
            except Exception as e:  # noqa: BLE001 - eager itself refuses the sample
                wants.append(e)
    live = [i for i, w in enumerate(wants) if not isinstance(w, Exception)]
    results = [("skip", f"eager raises {type(w).__name__}") if isinstance(w, Exception) else None for w in wants]

    def compile_and_check(idx, tag):
        offsets, flat = [], []
        for i in idx:
            offsets.append(len(flat))
            flat.extend(cases[i].leaves)

        def fn(*ts):
            outs = []
            for i, off in zip(idx, offsets):
                res = _outputs(cases[i].call(*ts[off:off + len(cases[i].leaves)]))
                outs.extend(res)
            return tuple(outs)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = chroma.compile(fn, tuple(flat), out=os.path.join(workdir, tag), cache_dir=cache)
        got = prog(*[_np(t) for t in flat])
        got = list(got) if isinstance(got, tuple) else [got]
        res, k = [], 0
        for i in idx:
            n = len(wants[i])
            err = _compare(got[k:k + n], wants[i], cases[i].tol, cases[i].canon)
            if err and _compare_exact(cases[i], got[k:k + n], wants[i]):
                err = ""
            res.append(err)
            k += n
        return res

    def attempt(idx, tag):
        try:
            for i, err in zip(idx, compile_and_check(idx, tag)):
                results[i] = ("fail", err) if err else ("pass", "")
            return None
        except Exception as e:  # noqa: BLE001 - fall back to smaller programs
            return e

    # Groups of a dtype Chroma may have no type for (bfloat16) are probed with their first
    # sample: when its input is rejected for its dtype, every sample of the group is, and
    # the group stays out of the shared program.
    for g in probe or ():
        idx = [i for i in groups[g] if i in live]
        if not idx:
            continue
        e = attempt(idx[:1], f"p{g}")
        if e is not None and re.search(r"input '[^']*': dtype \w+ is not supported", str(e)):
            for i in idx:
                results[i] = _classify(e)
            live = [i for i in live if i not in idx]
        elif e is not None:
            results[idx[0]] = None  # decided again below, with the others
    if len(live) > CHUNK:
        # Export time grows faster than linearly with the program: at most CHUNK samples per
        # program (linspace has 400 samples per dtype), each chunk from one dtype group.
        for g, idx in enumerate(groups if groups else [live]):
            idx = [i for i in idx if i in live and results[i] is None]
            for k in range(0, len(idx), CHUNK):
                part = idx[k:k + CHUNK]
                sub = run_cases([cases[i] for i in part], workdir + f"_g{g}c{k}", cache)
                for i, r in zip(part, sub):
                    results[i] = r
        return results
    first = attempt(live, "all") if len(live) > 1 else None
    if len(live) > 1 and first is None:
        return results
    several = groups and len(groups) > 1
    for g, idx in enumerate(groups if several else [live]):
        idx = [i for i in idx if i in live and results[i] is None]
        e = (attempt(idx, f"g{g}") if several else first) if len(idx) > 1 else None
        # An input dtype Chroma has no type for rejects every sample of the group alike.
        if e is not None and re.search(r"input '[^']*': dtype \w+ is not supported", str(e)):
            for i in idx:
                results[i] = _classify(e)
    for i in live:
        if results[i] is not None:
            continue
        try:
            err = compile_and_check([i], f"s{i}")[0]
            results[i] = ("fail", err) if err else ("pass", "")
        except Exception as e:  # noqa: BLE001
            results[i] = _classify(e)
    return results


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
    by, causes = {}, {}
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
            if section == "Per OpInfo entry":
                m = row.match(line)
                if not m:
                    continue
                name, run, dt, p, fl, un, reason = m.groups()
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


def write_markdown(report, path, note=""):
    ops = report["ops"]
    for o in ops:
        for d in o.get("dtypes", {}).values():
            for smp in d.get("samples", []):
                if _random_sample(smp):
                    smp["status"], smp["reason"] = "skip", "draws random numbers: " + smp["reason"]
    excluded = [o for o in ops if o.get("excluded")]
    f32_all = [o for o in ops if "float32" in o.get("dtypes", {}) and "samples" in o["dtypes"]["float32"]]
    # Entries where eager itself raises on every float32 sample (CUDA-only jiterator entries)
    # or returns no tensor (item, equal, allclose) have nothing to compare: listed, not counted.
    f32 = [o for o in f32_all if any(x["status"] != "skip" for x in o["dtypes"]["float32"]["samples"])]
    nothing = [o["name"] for o in f32_all if o not in f32]

    def counts(o, dt):
        c = {"pass": 0, "fail": 0, "unsupported": 0, "skip": 0}
        for smp in o["dtypes"].get(dt, {}).get("samples", []):
            c[smp["status"]] += 1
        return c

    def all_pass(o, dt):
        c = counts(o, dt)
        return c["pass"] > 0 and c["fail"] == 0 and c["unsupported"] == 0

    passing = [o for o in f32 if all_pass(o, "float32")]
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
        ok = [o for o in have if all_pass(o, dt)]
        lines.append(f"- Entries with {dt} samples: {len(have)}; passing every {dt} sample: {len(ok)}.")
    # Why the others do not pass: the first failing float32 sample's reason, by cause.
    causes = {}
    for o in f32:
        if all_pass(o, "float32"):
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
    lines += ["", "A sample passes when Chroma's outputs equal eager PyTorch's within the entry's "
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
              "CPU kernel for a dtype have no row for it.",
              "", "## Core ATen opset", ""]
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
    lines += ["", "## Per OpInfo entry", "",
              "| OpInfo | run | dtype | pass | fail | unsupported | first reason |", "|---|---|---|---:|---:|---:|---|"]
    for o in ops:
        if o.get("excluded"):
            continue
        for dt, d in o.get("dtypes", {}).items():
            run = d.get("run", o.get("run", ""))
            if "samples" not in d:
                lines.append(f"| {o['name']} | {run} | {dt} | | | | {d.get('error', '')[:150]} |")
                continue
            c = counts(o, dt)
            reason = next((smp["reason"] for smp in d["samples"] if smp["status"] in ("fail", "unsupported")), "")
            reason = " ".join(reason.split())[:160].replace("|", "/")
            lines.append(f"| {o['name']} | {run} | {dt} | {c['pass']} | {c['fail']} | {c['unsupported']} | {reason} |")
    lines += ["", "## Excluded on purpose", "", "| OpInfo | why |", "|---|---|"]
    for o in excluded:
        lines.append(f"| {o['name']} | {o['excluded']} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
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
    a = ap.parse_args(argv)
    if a.from_json:
        # Several reports (comma-separated, e.g. parallel shards and a re-run): a later report's
        # results for an entry and dtype replace earlier ones (its other dtypes keep theirs, each
        # row naming its own run); op_db order is kept.
        # An input that is itself a merged report keeps its runs (renumbered after the
        # earlier inputs'); a plain report is one run.
        merged, order, seconds, runs = None, [], 0.0, []
        for path in a.from_json.split(","):
            if path.endswith(".md"):
                r = report_from_markdown(path)
            else:
                with open(path) as f:
                    r = json.load(f)
            seconds += r.get("seconds", 0)
            if merged is None:
                merged = dict(r, ops=[])
                by = {}
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
        try:  # op_db order, as a single run writes it
            import warnings as _w
            with _w.catch_warnings():
                _w.simplefilter("ignore")
                from torch.testing._internal.common_methods_invocations import op_db
            rank = {o.name + ("." + o.variant_test_name if o.variant_test_name else ""): i for i, o in enumerate(op_db)}
            for n in rank:  # entries none of the reports ran
                if n not in by:
                    order.append(n)
                    by[n] = {"name": n, "dtypes": {}, "not_run": True}
            order.sort(key=lambda n: rank.get(n, len(rank)))
        except ImportError:
            pass
        merged["ops"] = [by[n] for n in order]
        merged["seconds"] = seconds
        if a.json:
            with open(a.json, "w") as f:
                json.dump(merged, f, indent=1)
        write_markdown(merged, a.markdown or os.path.join("docs", "ops.md"), a.note)
        return
    os.environ.setdefault("CHROMA_NUM_THREADS", "1")
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    if a.dtypes == "all":
        a.dtypes = ALL_DTYPES
    dtypes = [getattr(torch, DTYPES[d]) for d in a.dtypes.split(",")]
    pat = re.compile(a.ops) if a.ops else None
    report = {"torch": torch.__version__, "dtypes": a.dtypes.split(","), "max_samples": a.max_samples, "ops": []}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="chroma-opinfo-") as tmp:
        cache = os.path.join(tmp, "cache")
        shard_k, shard_n = (int(v) for v in a.shard.split("/")) if a.shard else (0, 1)
        for pos, op in enumerate(op_db):
            full = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
            if pat and not pat.search(full):
                continue
            if pos % shard_n != shard_k:
                continue
            entry = {"name": full, "aten_name": op.aten_name, "dtypes": {}}
            why = excluded(op)
            if why:
                entry["excluded"] = why
                report["ops"].append(entry)
                continue
            supported = op.supported_dtypes("cpu")
            # Every sample of every dtype goes into one program (one compile per entry when
            # all of them compile); run_cases falls back to one program per dtype, then per sample.
            per_dtype = []  # (dname, cases, bad)
            for dt in dtypes:
                dname = str(dt).replace("torch.", "")
                if dt not in supported:
                    continue
                try:
                    samples = list(op.sample_inputs("cpu", dt, requires_grad=False))
                except Exception as e:  # noqa: BLE001
                    entry["dtypes"][dname] = {"error": f"sample generation: {e}"}
                    continue
                if a.max_samples:
                    samples = samples[:a.max_samples]
                tol = tolerances(op, dt)
                cases, bad = [], []
                for smp in samples:
                    try:
                        cases.append(Case(op, smp, tol))
                    except Exception as e:  # noqa: BLE001 - e.g. sparse inputs: not a dense tensor
                        bad.append((repr(smp)[:160], f"input: {type(e).__name__}: {e}"[:300]))
                per_dtype.append((dname, cases, bad))
            flat, groups = [], []
            for _, cases, _ in per_dtype:
                groups.append(list(range(len(flat), len(flat) + len(cases))))
                flat.extend(cases)
            work = os.path.join(tmp, re.sub(r"\W", "_", full))
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
            report["ops"].append(entry)
            # Written after every entry, so a run that is stopped keeps what it measured.
            report["seconds"] = round(time.time() - t0, 1)
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)
    report["seconds"] = round(time.time() - t0, 1)
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"report: {a.json} ({report['seconds']} s)")
    if a.markdown:
        write_markdown(report, a.markdown, a.note)
        print(f"wrote {a.markdown}")


if __name__ == "__main__":
    main()

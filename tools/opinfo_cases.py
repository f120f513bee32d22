"""The OpInfo conformance run's samples and how they are judged (tools/opinfo_conformance.py
is the command; tests/python/test_opinfo_subset.py runs a few entries through this module).

A Case is one OpInfo sample as a function of its tensors (other arguments baked in);
run_cases compiles a list of them with chroma.compile (one program for all when they
compile, then per group, then per sample, so every failure gets its own reason), runs them
and compares each output with eager PyTorch at the entry's tolerances (`tolerances`:
torch.testing's defaults widened by the entry's own forward-test overrides), singular and
eigen vectors and tied indices in a canonical form (CANONICAL, _tie_canon). Each case ends
as ("pass" | "fail" | "unsupported" | "skip", reason). `excluded` names the families left out
on purpose (random-number ops, ops returning uninitialized memory)."""

from __future__ import annotations

import os
import re
import sys
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

"""Quantized weights (docs/quantization.md): the `weights=` option, the accuracy report, the
dry-run report with its sensitivity list, and NumPy access to the quantizer.

The formats are MLX's affine group quantization (groups of 64 along the contracted
dimension, 8, 6 or 4 bits, float16 scales and biases) and bfloat16, applied to the constant
right operands of matrix products; the C++ compiler decides per weight (src/quant/quant.h)
and lists every decision in the manifest.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

FORMATS = ("fp32", "bf16", "q8", "q6", "q4")
BITS = {"q8": 8, "q6": 6, "q4": 4}
GROUP = 64

__all__ = ["FORMATS", "weights_spec", "quantize", "dequantize", "accuracy_metrics", "quant_report", "record_accuracy"]


def weights_spec(weights: Any) -> str:
    """The compiler's policy string for a `weights=` argument ("" when every weight stays
    float32): a format name, or a dict {"default": fmt, "unembedding": fmt, pattern: fmt,
    "activations": "auto" | "bf16" | "fp32", "attention": "bf16" | "fp32"}."""
    if weights is None or weights == "fp32" or weights == "":
        return ""
    if isinstance(weights, (list, tuple)):
        raise TypeError("weights: a list of variants is for chroma.compile (one artifact per variant)")
    if isinstance(weights, str) and "=" in weights:  # a policy string already
        return weights_spec(dict(item.split("=", 1) for item in weights.split(";") if item))
    if isinstance(weights, str):
        if weights not in FORMATS:
            raise ValueError(f"weights={weights!r}: expected one of {', '.join(FORMATS)} or a dict of rules")
        return f"default={weights}"
    if isinstance(weights, dict):
        items = []
        for key, value in weights.items():
            if not isinstance(key, str) or not key or ";" in key or "=" in key:
                raise ValueError(f"weights: bad rule key {key!r} (a pattern, 'default', 'unembedding', 'activations' "
                                 f"or 'attention')")
            if key == "activations":
                if value not in ("auto", "bf16", "fp32"):
                    raise ValueError(f"weights: activations={value!r}: expected 'auto', 'bf16' or 'fp32'")
            elif key == "attention":
                if value not in ("bf16", "fp32"):
                    raise ValueError(f"weights: attention={value!r}: expected 'bf16' or 'fp32'")
            elif value not in FORMATS:
                raise ValueError(f"weights: {key}={value!r}: expected one of {', '.join(FORMATS)}")
            items.append(f"{key}={value}")
        spec = ";".join(items)
        return "" if spec in ("", "default=fp32") else spec
    raise TypeError(f"weights: expected a format name or a dict of rules, not {type(weights).__name__}")


# ---- the quantizer, from NumPy ------------------------------------------------------------------

def quantize(w: np.ndarray, bits: int):
    """MLX affine quantization of a float32 [rows, K] matrix along K with the compiler's own
    code: (q uint8 [rows, K], scales float16 [rows, ceil(K/64)], biases float16 likewise)."""
    from .. import _compiler

    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError("quantize: expected a 2-D matrix [rows, K]")
    rows, k = w.shape
    q, s, b = _compiler.quantize(w.tobytes(), rows, k, bits)
    groups = (k + GROUP - 1) // GROUP
    return (np.frombuffer(q, np.uint8).reshape(rows, k).copy(),
            np.frombuffer(s, np.float16).reshape(rows, groups).copy(),
            np.frombuffer(b, np.float16).reshape(rows, groups).copy())


def dequantize(q: np.ndarray, scales: np.ndarray, biases: np.ndarray) -> np.ndarray:
    """s * q + b in float32 (each group's scale and bias over its 64 weights)."""
    rows, k = q.shape
    rep = lambda a: np.repeat(a.astype(np.float32), GROUP, axis=1)[:, :k]  # noqa: E731
    return rep(scales) * q.astype(np.float32) + rep(biases)


def simulate(w: np.ndarray, fmt: str) -> np.ndarray:
    """The weights a [rows, K] matrix (K the contracted dimension) stands for in `fmt`."""
    w = np.asarray(w, dtype=np.float32)
    if fmt == "fp32":
        return w
    if fmt == "bf16":
        import ml_dtypes

        return w.astype(ml_dtypes.bfloat16).astype(np.float32)
    return dequantize(*quantize(w, BITS[fmt]))


# ---- accuracy ----------------------------------------------------------------------------------

def accuracy_metrics(got: np.ndarray, ref: np.ndarray) -> Dict[str, Any]:
    """Relative L2, max abs and cosine of `got` against `ref`; over the last axis of a float
    output with at least 2 columns (logits), top-1 agreement and the KL divergence
    KL(softmax(ref) || softmax(got)), averaged over rows."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    d = got - ref
    nr = float(np.linalg.norm(ref))
    out: Dict[str, Any] = {
        "shape": list(ref.shape),
        "rel_l2": float(np.linalg.norm(d) / nr) if nr > 0 else float(np.linalg.norm(d)),
        "max_abs": float(np.max(np.abs(d))) if d.size else 0.0,
        "cosine": float(np.dot(got.ravel(), ref.ravel()) / (np.linalg.norm(got) * nr)) if nr > 0 and np.linalg.norm(got) > 0 else 1.0,
    }
    if ref.ndim >= 1 and ref.shape[-1] >= 2 and ref.size:
        r2 = ref.reshape(-1, ref.shape[-1])
        g2 = got.reshape(-1, ref.shape[-1])
        out["top1_agreement"] = float(np.mean(np.argmax(r2, -1) == np.argmax(g2, -1)))
        lp = r2 - r2.max(-1, keepdims=True)
        lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
        lq = g2 - g2.max(-1, keepdims=True)
        lq = lq - np.log(np.exp(lq).sum(-1, keepdims=True))
        out["kl_divergence"] = float(np.mean(np.sum(np.exp(lp) * (lp - lq), -1)))
    return out


def _flat_outputs(x: Any) -> List[Any]:
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in _flat_outputs(item)]
    if isinstance(x, dict):
        return [y for item in x.values() for y in _flat_outputs(item)]
    return [x]


def _eager(model: Any, inputs: Sequence[Any]) -> List[np.ndarray]:
    import torch

    from ..arrays import to_numpy

    m = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    with torch.no_grad():
        outs = _flat_outputs(m(*[copy.deepcopy(t) for t in inputs]))
    return [to_numpy(o.float()) if o.is_floating_point() else to_numpy(o) for o in outs]


def record_accuracy(out: str, model: Any, inputs: Sequence[Any],
                    calibration: Optional[Sequence[Sequence[Any]]] = None) -> Dict[str, Any]:
    """Runs the artifact in `out` and float32 PyTorch on the example inputs (and any
    calibration inputs) and stores the comparison in the manifest under "accuracy"."""
    from ..arrays import to_numpy
    from ..runtime.registry import load_compiled

    # As chroma.compile returns it (CUDA and Metal artifacts on the SIMT emulator: any machine).
    prog = load_compiled(out, threads=1)
    sets = [tuple(inputs)] + [tuple(c) for c in (calibration or [])]
    per_output: List[List[Dict[str, Any]]] = []
    for ins in sets:
        prog.reset_state()
        got = prog(*[to_numpy(t) for t in ins])
        got = got if isinstance(got, (list, tuple)) else [got]
        ref = _eager(model, ins)
        for i, (g, r) in enumerate(zip(got, ref)):
            if not np.issubdtype(np.asarray(r).dtype, np.floating):
                continue
            while len(per_output) <= i:
                per_output.append([])
            per_output[i].append(accuracy_metrics(np.asarray(g, dtype=np.float32), np.asarray(r, dtype=np.float32)))
    report = {"reference": "PyTorch eager, float32 weights", "inputs": len(sets), "outputs": []}
    for i, ms in enumerate(per_output):
        if not ms:
            continue
        merged: Dict[str, Any] = {"output": i, "shape": ms[0]["shape"]}
        for key in ("rel_l2", "max_abs", "kl_divergence"):
            if key in ms[0]:
                merged[key] = max(m[key] for m in ms)
        for key in ("cosine", "top1_agreement"):
            if key in ms[0]:
                merged[key] = min(m[key] for m in ms)
        report["outputs"].append(merged)
    mpath = os.path.join(out, "manifest.json")
    with open(mpath, encoding="utf-8") as f:
        manifest = json.load(f)
    manifest["accuracy"] = report
    with open(mpath, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    return report


# ---- the dry run ---------------------------------------------------------------------------------

def quant_report(model: Any, example_inputs: Any, *, weights: Any = "q4", sensitivity: bool = True,
                 top: int = 20) -> Dict[str, Any]:
    """A dry run before compiling: which weights of `model`'s linear layers and matrix
    parameters would be stored how (bytes per layer and in total) under `weights`, and, with
    `sensitivity`, the layers ranked by the output error each causes when it alone is
    quantized (PyTorch runs with that one weight replaced by the values it stands for).

    Parameters considered: 2-D and 3-D (stacked experts) float parameters, quantized along
    their last dimension (a torch.nn.Linear's input features, an embedding's row); a
    torch.nn.Embedding's weight has the role "embedding". The compiler decides on the operands
    of the products and the tables of the Gathers it finds; its decisions are in the manifest.
    """
    import torch

    from .. import _compiler

    spec_text = weights_spec(weights)
    inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    params = {n: p for n, p in model.named_parameters() if p.dim() in (2, 3) and p.is_floating_point()}
    roles = {f"{n}.weight" if n else "weight": "embedding" for n, mod in model.named_modules()
             if isinstance(mod, torch.nn.Embedding)}
    rows = []
    total32 = total = 0
    for name, p in params.items():
        shape = list(p.shape)
        k, n = shape[-1], shape[-2]
        mats = shape[0] if p.dim() == 3 else 1
        fmt, reason, b = _compiler.decide_weight(spec_text, name, roles.get(name, ""), k, n, mats)
        b32 = p.numel() * 4
        total32 += b32
        total += b
        rows.append({"name": name, "shape": shape, "format": fmt, "reason": reason, "bytes_fp32": b32, "bytes": b})
    report: Dict[str, Any] = {"weights": spec_text or "fp32", "layers": rows, "bytes_fp32": total32, "bytes": total}
    if sensitivity:
        ref = _eager(model, inputs)
        sens = []
        for row in rows:
            if row["format"] == "fp32":
                continue
            m = copy.deepcopy(model)
            p = dict(m.named_parameters())[row["name"]]
            with torch.no_grad():
                w = p.detach().float().reshape(-1, p.shape[-1]).numpy()
                p.copy_(torch.from_numpy(simulate(w, row["format"]).reshape(tuple(p.shape))))
            got = _eager(m, inputs)
            errs = [accuracy_metrics(g, r)["rel_l2"] for g, r in zip(got, ref) if np.issubdtype(r.dtype, np.floating)]
            sens.append({"name": row["name"], "format": row["format"], "rel_l2": max(errs) if errs else 0.0})
        sens.sort(key=lambda d: -d["rel_l2"])
        report["sensitivity"] = sens[:top] if top else sens
    return report


def format_report(report: Dict[str, Any]) -> str:
    """quant_report's result as text."""
    lines = [f"weights: {report['weights']}"]
    for r in report["layers"]:
        lines.append(f"  {r['name']:<48} {str(r['shape']):<20} {r['format']:<5} {r['bytes'] / 1e6:9.3f} MB  ({r['reason']})")
    lines.append(f"total: {report['bytes'] / 1e6:.2f} MB (float32: {report['bytes_fp32'] / 1e6:.2f} MB)")
    if "sensitivity" in report:
        lines.append("sensitivity (output relative L2 with that layer alone quantized):")
        for s in report["sensitivity"]:
            lines.append(f"  {s['name']:<48} {s['format']:<5} {s['rel_l2']:.3e}")
    return "\n".join(lines)

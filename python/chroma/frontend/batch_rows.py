"""Whether a model treats the rows of its batch independently (chroma.compile(batch=...)).

A program compiled for a range of batch sizes answers a batch of b rows with programs
compiled for other sizes (chroma.batching): that is only right when every output row depends
on its own input rows alone. Two checks, both before anything is compiled:

1. Structure. The model is exported with a dynamic batch dimension (dimension 0 of every
   tensor input, one symbol for all: ``torch.export.Dim``), so every intermediate's shape says
   which of its dimensions carry the batch (their size is an expression of the symbol). A
   model that specializes on the batch size fails here (torch.export's own message). Then
   each node is checked against the ways an operation combines rows:
   - an operation along a batch dimension (an argument ``dim``/``dims`` naming one:
     reductions, softmax, cumulative sums, sorts, concatenation, selection, flips), except
     the ones that only move it (permute, transpose, squeeze, unsqueeze) and slices that keep
     every row;
   - a product or convolution that sums over a batch dimension;
   - a result with no batch dimension computed from inputs with one (a reduction over all
     elements, a batch norm's batch statistics in training mode);
   - a view or reshape that moves the batch from being the outermost factor of the elements
     before it (``[B, S, D] -> [B * S, D]`` keeps it, ``[S, B * D] -> [S * B, D]`` does not);
   - an output without the batch as its dimension 0.
2. Values. The model is run eagerly on the example batch (at least 2 rows) and again with
   its first row replaced; every other row of every output must stay what it was (to a
   relative 1e-5 of the output's scale). This catches what the structure cannot show (an
   operation outside the rules above, randomness such as dropout in training mode).

Either failure raises BatchRowsError naming the node, its op and its source line.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence

import torch

from .exporter import _EXPORT_LOCK, ExportError


class BatchRowsError(ExportError):
    """The model combines rows of its batch: it cannot be compiled for a batch range."""


# Operations with a `dim` argument that only move or keep a dimension (never combine rows).
_MOVES = {"permute", "transpose", "t", "squeeze", "unsqueeze", "movedim", "expand", "view", "reshape",
          "_unsafe_view", "alias", "clone", "_to_copy", "contiguous", "detach"}
# Products and convolutions: (name, the first operand's contracted dims, the second's).
_PRODUCTS = {"mm": ((1,), (0,)), "bmm": ((2,), (1,)), "addmm": ((1,), (0,)), "baddbmm": ((2,), (1,))}


def _has_batch(size: Any, sym: Any) -> bool:
    return isinstance(size, torch.SymInt) and sym in size.node.expr.free_symbols


def _batch_dims(val: Any, sym: Any) -> List[int]:
    if not isinstance(val, torch.Tensor):
        return []
    return [i for i, s in enumerate(val.shape) if _has_batch(s, sym)]


def _vals(x: Any) -> List[Any]:
    if isinstance(x, (list, tuple)):
        return [v for e in x for v in _vals(e)]
    return [x]


def _where(node: Any) -> str:
    """node 'sum_1' (aten.sum.dim_IntList, model.py:17: `x - x.sum(0)`): the innermost frame."""
    import re

    lines = [ln.strip() for ln in (node.meta.get("stack_trace") or "").strip().splitlines() if ln.strip()]
    src = ""
    for i, ln in enumerate(lines):
        m = re.match(r'File "([^"]+)", line (\d+)', ln)
        if m:
            code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            src = f", {m.group(1).rsplit('/', 1)[-1]}:{m.group(2)}" + (f": `{code}`" if code else "")
    return f"node '{node.name}' ({node.target}{src})"


def _prefix(shape: Sequence[Any], dim: int) -> Optional[int]:
    """The product of the sizes before `dim` (None when one of them is symbolic)."""
    p = 1
    for s in shape[:dim]:
        if isinstance(s, torch.SymInt):
            return None
        p *= int(s)
    return p


def _check_node(node: Any, sym: Any) -> Optional[str]:
    """Why this node combines rows, or None."""
    target = node.target
    name = getattr(getattr(target, "_schema", None), "name", str(target)).split("::")[-1]
    args = list(node.args)
    tensor_args = [a for a in _vals(args) + _vals(list(node.kwargs.values())) if hasattr(a, "meta")]
    in_batch = {id(a): _batch_dims(a.meta.get("val"), sym) for a in tensor_args}
    if not any(in_batch.values()):
        return None
    outs = _vals(node.meta.get("val"))
    out_tensors = [o for o in outs if isinstance(o, torch.Tensor)]
    if not out_tensors:  # sizes (sym_size), assertions: no values
        return None
    schema = getattr(target, "_schema", None)
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            if a.name == "training" and (args[i] if i < len(args) else node.kwargs.get("training")) is True:
                return "it normalizes with the batch's own statistics (a batch norm in training mode)"
    empty = lambda t: any(isinstance(d, int) and d == 0 for d in t.shape)  # noqa: E731
    if any(not empty(o) and not _batch_dims(o, sym) for o in out_tensors):
        return "its result has no batch dimension though its input has one (a reduction over the batch)"
    first = args[0] if args and hasattr(args[0], "meta") else None
    first_val = first.meta.get("val") if first is not None else None
    first_dims = in_batch.get(id(first), []) if first is not None else []
    if name in _PRODUCTS and len(args) >= 2:
        a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
        ca, cb = _PRODUCTS[name]
        if any(d in _batch_dims(a.meta.get("val"), sym) for d in ca) or any(
                d in _batch_dims(b.meta.get("val"), sym) for d in cb):
            return "it sums products over the batch"
        return None
    if name == "convolution" and len(args) >= 2:
        if 1 in _batch_dims(args[0].meta.get("val"), sym) or _batch_dims(args[1].meta.get("val"), sym):
            return "it convolves over the batch"
        return None
    if name in ("view", "reshape", "_unsafe_view") and first_val is not None:
        out = out_tensors[0] if out_tensors else None
        od = _batch_dims(out, sym)
        if len(first_dims) != 1 or len(od) != 1:
            return "it reshapes the batch into several dimensions"
        pin, pout = _prefix(first_val.shape, first_dims[0]), _prefix(out.shape, od[0])
        if pin is None or pout is None or pin != pout:
            return "it moves the batch from the outermost position of its elements"
        return None
    if name in ("slice",) and first_val is not None:
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
        dim = dim % first_val.dim()
        if dim in first_dims:
            start = args[2] if len(args) > 2 else node.kwargs.get("start", 0)
            step = args[4] if len(args) > 4 else node.kwargs.get("step", 1)
            end = args[3] if len(args) > 3 else node.kwargs.get("end", None)
            full = (start in (0, None) and step == 1 and (end is None or isinstance(end, torch.SymInt)
                                                          or (isinstance(end, int) and end >= 2 ** 62)))
            if not full:
                return "it takes some of the batch's rows"
        return None
    if name in _MOVES:
        return None
    if name in ("cat", "concat") and args and isinstance(args[0], (list, tuple)):
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
        for t in args[0]:
            v = t.meta.get("val") if hasattr(t, "meta") else None
            if isinstance(v, torch.Tensor) and v.dim() and dim % v.dim() in _batch_dims(v, sym):
                return "it concatenates along the batch"
        return None
    if schema is not None and first_val is not None:
        for i, a in enumerate(schema.arguments):
            if a.name not in ("dim", "dims"):
                continue
            v = args[i] if i < len(args) else node.kwargs.get(a.name, a.default_value if a.has_default_value() else None)
            if v is None:
                dims = list(range(first_val.dim()))  # every dimension
            else:
                dims = [int(d) for d in (v if isinstance(v, (list, tuple)) else [v])]
            if first_val.dim() and any(d % first_val.dim() in first_dims for d in dims):
                return "it works along the batch dimension"
    return None


def check_structure(module: torch.nn.Module, example_inputs: tuple, hi: int) -> None:
    """Check 1 (module docstring): raises BatchRowsError, or ExportError where torch.export
    refuses a dynamic batch."""
    from torch.export import Dim

    from . import decompositions

    batch = Dim("batch", min=2, max=max(int(hi), 2))
    dynamic = tuple({0: batch} if isinstance(x, torch.Tensor) and x.dim() > 0 else None for x in example_inputs)
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            raise BatchRowsError(f"input {i} has no batch dimension (a batch range batches dimension 0 of every input)")
    with _EXPORT_LOCK:
        try:
            ep = torch.export.export(module, example_inputs, dynamic_shapes=dynamic, strict=False)
            ep = ep.run_decompositions(decompositions.table())
        except Exception as e:  # a model that specializes on the batch size
            raise BatchRowsError(f"the model cannot take a batch of any size (dimension 0 of every input): "
                                 f"torch.export with a dynamic batch failed: {type(e).__name__}: {e}") from e
    graph = ep.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    syms = [s.node.expr for n in placeholders for s in getattr(n.meta.get("val"), "shape", ())
            if isinstance(s, torch.SymInt) and s.node.expr.free_symbols]
    if not syms:
        raise BatchRowsError("the exported model has no dynamic batch dimension")
    sym = next(iter(syms[0].free_symbols))
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        why = _check_node(node, sym)
        if why:
            raise BatchRowsError(f"the model combines rows of its batch: {why}, at {_where(node)}")
    out = next(n for n in graph.nodes if n.op == "output")
    for i, o in enumerate(_vals(out.args[0])):
        if not hasattr(o, "meta"):
            continue
        dims = _batch_dims(o.meta.get("val"), sym)
        val = o.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        if dims != [0] or _prefix(val.shape, 0) != 1:
            raise BatchRowsError(f"output {i} does not have the batch as its dimension 0 (its shape: {tuple(val.shape)})")


def check_values(module: Any, example_inputs: tuple) -> None:
    """Check 2 (module docstring)."""
    from torch.utils._pytree import tree_flatten

    xs = [x if x.shape[0] >= 2 else x.repeat(2, *([1] * (x.dim() - 1))) for x in example_inputs]
    other = []
    g = torch.Generator().manual_seed(1234)
    for x in xs:
        y = x.clone()
        if y.is_floating_point():
            y[0] = torch.randn(y[0].shape, generator=g, dtype=torch.float32).to(y.dtype) * (y.float().std() + 1)
        elif y.dtype == torch.bool:
            y[0] = ~y[0]
        else:
            y[0] = y[-1]
        other.append(y)
    with torch.no_grad():
        a = tree_flatten(module(*xs))[0]
        b = tree_flatten(module(*other))[0]
    for i, (u, v) in enumerate(zip(a, b)):
        if not isinstance(u, torch.Tensor) or u.shape[0] < 2:
            continue
        u, v = u[1:].double(), v[1:].double()
        scale = float(u.abs().max()) if u.numel() else 0.0
        if not torch.allclose(u, v, rtol=1e-5, atol=1e-5 * max(scale, 1e-30), equal_nan=True):
            raise BatchRowsError(f"output {i}: changing row 0 of the inputs changed other rows of the output "
                                 f"(the model combines rows of its batch, or is not deterministic)")


def check_rows(model: Any, example_inputs: Iterable[Any], hi: int) -> None:
    """Both checks; raises BatchRowsError (an ExportError) naming what combines rows."""
    from .exporter import _wrap_function

    example_inputs = tuple(example_inputs)
    module = model if isinstance(model, torch.nn.Module) else _wrap_function(model)
    check_structure(module, example_inputs, hi)
    check_values(model, example_inputs)

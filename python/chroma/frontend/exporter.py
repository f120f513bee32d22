"""Export a fixed-shape PyTorch model to a Chroma ``.cgraph`` file.

Usage::

    from chroma.frontend.exporter import export
    g = export(model.eval(), (torch.randn(4, 7),), "model.cgraph")
    g.json   # graph description (dict), see docs/graph_format.md
    g.blob   # weight data (bytes)

Pipeline: ``torch.export.export(module, example_inputs)`` (non-strict) followed
by ``ep.run_decompositions()`` (torch's default table, the core ATen opset, with
the changes in ``decompositions.py``), then the
FX graph is serialized. ``export`` does NOT call ``module.eval()``: export in
the mode you want to compile (usually eval). Buffer mutations (e.g. BatchNorm
running stats in train mode) are dropped with a warning.

Supported torch: 2.14 (other versions >= 2.1 work with a warning).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import math
import operator
import os
import re
import sys
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from . import decompositions, graph_file

__all__ = ["export", "ExportedGraph", "ExportError", "check_torch_version", "PRODUCER_VERSION",
           "SUPPORTED_TORCH", "DTYPES"]

PRODUCER_VERSION = "0.1.0"
SUPPORTED_TORCH = (2, 14)
MIN_TORCH = (2, 1)

DTYPES: Dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32",
    torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}
# torch.export is not thread-safe: its tracing installs process-wide dispatch modes and module
# state (two exports at once fail with "ProxyTorchDispatchMode slot already occupied" or "Trying
# to pop empty mode stack"). Chroma serializes it here, so chroma.compile and chroma.jit may be
# called from many threads of one process; the rest of a compile (serializing the graph, the
# native compiler, which releases the GIL) runs side by side. Re-entrant: a model whose forward
# compiles another with Chroma exports that one in the same thread.
_EXPORT_LOCK = threading.RLock()

_LAYOUTS = {torch.strided: "strided", torch.sparse_coo: "sparse_coo"}
_MEMORY_FORMATS = {
    torch.contiguous_format: "contiguous_format", torch.channels_last: "channels_last",
    torch.channels_last_3d: "channels_last_3d", torch.preserve_format: "preserve_format",
}
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_THIS_FILE = os.path.realpath(__file__)
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.*)$')


class ExportError(RuntimeError):
    """The model cannot be exported to a Chroma graph (message says why)."""


@dataclasses.dataclass
class ExportedGraph:
    """Result of :func:`export`: the graph JSON dict and the weight data, kept as views of
    the model's own tensors ((offset, bytes) pieces of a ``data_length``-byte blob): writing
    the graph streams them to the file, so an export holds no second copy of the weights."""

    json: dict
    pieces: list
    data_length: int

    @property
    def blob(self) -> bytes:
        """The data blob as one bytes object (a copy of every weight; write() does not make it)."""
        out = bytearray(self.data_length)
        for offset, piece in self.pieces:
            view = memoryview(piece).cast("B")
            out[offset:offset + view.nbytes] = view
        return bytes(out)

    def iter_blob(self):
        """The blob's bytes piece by piece (gaps as zeros), for hashing without a copy."""
        at = 0
        for offset, piece in self.pieces:
            if offset > at:
                yield bytes(offset - at)
            yield piece
            at = offset + memoryview(piece).nbytes
        if self.data_length > at:
            yield bytes(self.data_length - at)

    def write(self, path: str) -> None:
        """Write this graph as a ``.cgraph`` file at ``path``, the weights streamed from the tensors."""
        graph_file.write_pieces(path, self.json, self.pieces, self.data_length)

    def to_bytes(self) -> bytes:
        """Return the ``.cgraph`` file contents."""
        return graph_file.pack(self.json, self.blob)


class _FunctionModule(torch.nn.Module):
    """Wraps a plain function of tensors so torch.export can trace it."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _wrap_function(fn: Callable) -> torch.nn.Module:
    """nn.Module calling ``fn``; its forward mimics fn's positional parameter
    names so the graph inputs get the function's argument names.

    torch (2.13) records node stack traces only from frames named ``forward``
    (or registered "anchors"), so ``fn`` is registered as an anchor to get
    source lines pointing into it (private API, skipped if absent).
    """
    anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if anchor is not None:
        try:
            anchor(fn)
        except Exception:  # pragma: no cover - best effort only
            pass
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = None
    if not params or any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                         for p in params):
        return _FunctionModule(fn)

    class _Named(_FunctionModule):
        def forward(self, *args):
            return self.fn(*args)

    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    _Named.forward.__signature__ = inspect.Signature(
        [self_param] + [p.replace(default=inspect.Parameter.empty) for p in params])
    return _Named(fn)


def check_torch_version(version: str) -> None:
    """Error if ``version`` < 2.1, warn if its major.minor is not 2.14."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        warnings.warn(f"chroma: cannot parse torch version {version!r}")
        return
    mm = (int(m.group(1)), int(m.group(2)))
    if mm < MIN_TORCH:
        raise ExportError(f"chroma requires torch >= 2.1 (found {version}); "
                          f"supported version is 2.14")
    if mm != SUPPORTED_TORCH:
        warnings.warn(f"chroma is tested with torch 2.14; found {version}, proceeding")


def _dtype_name(dtype: torch.dtype, what: str) -> str:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ExportError(f"{what} has unsupported dtype {dtype}; supported: "
                          f"{', '.join(DTYPES.values())}") from None


def _shape(t: Any, what: str) -> List[int]:
    try:
        return [int(d) for d in t.shape]
    except (TypeError, ValueError):  # symbolic sizes
        raise ExportError(f"{what} has a non-static shape {tuple(t.shape)}; "
                          f"chroma needs fixed shapes") from None


def source_of(node: torch.fx.Node) -> str:
    """``"<file>:<line> in <func>: <code>"`` for the user's frame of ``node``.

    Uses the last frame of ``node.meta["stack_trace"]`` outside the torch
    package; if every frame is inside torch, the last frame. Frames of this
    module (the function wrapper) are ignored. Returns ``""`` when no usable
    stack trace is recorded.
    """
    lines = (node.meta.get("stack_trace") or "").splitlines()
    frames = []
    for i, line in enumerate(lines):
        m = _FRAME_RE.match(line)
        if m:
            code = ""
            if i + 1 < len(lines) and not _FRAME_RE.match(lines[i + 1]):
                code = lines[i + 1].strip()
            frames.append((m.group("file"), m.group("line"), m.group("func"), code))
    # chroma's own function wrapper is never interesting
    frames = [f for f in frames if os.path.realpath(f[0]) != _THIS_FILE]
    if not frames:
        return ""
    user = [f for f in frames if not os.path.realpath(f[0]).startswith(_TORCH_DIR)]
    file, line, func, code = (user or frames)[-1]
    text = f"{os.path.basename(file)}:{line} in {func}"
    return f"{text}: {code}" if code else text


def _tensor_bytes(t: torch.Tensor):
    """Raw little-endian bytes of a tensor, contiguous, row-major: a uint8 NumPy view of the
    tensor's own storage where it is contiguous (no copy), else of a contiguous copy."""
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    if sys.byteorder != "little" and t.element_size() > 1:
        raise ExportError("chroma export requires a little-endian host")
    return t.reshape(-1).view(torch.uint8).numpy()


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.device.type == "meta"


def _into_fake_mode(module: torch.nn.Module, example_inputs: tuple) -> tuple:
    """A model built without its weights traces in the fake mode its parameters belong to:
    real example inputs are converted into it (their values are not needed)."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(tuple(module.parameters()) + tuple(module.buffers()))
    if mode is None:
        return example_inputs
    return tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) and not _is_fake(x) else x for x in example_inputs)


@contextlib.contextmanager
def structure_only():
    """A context in which modules are built without their weights: every parameter registered
    in it becomes a FakeTensor (its shape and dtype, no memory; its initialization runs on the
    fake), while buffers and everything else __init__ computes stay real (a model's
    non-persistent tables, which no weights file holds). Export such a model with
    ``weight_data``. The real tensor a layer allocates before registering it is never
    written, so its pages are never made resident."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    original = torch.nn.Module.register_parameter

    def register(self, name, param):
        original(self, name, param)
        if param is not None and not _is_fake(param):
            with mode:
                self._parameters[name] = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype),
                                                            requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register
    try:
        yield mode
    finally:
        torch.nn.Module.register_parameter = original


def _check_inputs(example_inputs: Any) -> tuple:
    if isinstance(example_inputs, list):
        example_inputs = tuple(example_inputs)
    if not isinstance(example_inputs, tuple):
        raise ExportError(f"example_inputs must be a tuple of tensors, got "
                          f"{type(example_inputs).__name__}")
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise ExportError(f"input {i} is a {type(x).__name__}, not a tensor; "
                              f"chroma graphs take tensor inputs only")
        _dtype_name(x.dtype, f"input {i}")
    return example_inputs


def _refusal(target: str) -> str:
    """Why the compiler refuses an ATen target by design ('' if it does not)."""
    try:
        from .. import _compiler
    except ImportError:  # exporting without the compiled module
        return ""
    return _compiler.refusal(target)


def _data_dependent(n: torch.fx.Node) -> bool:
    """True when a node's result has a symbolic (data-dependent) size."""
    val = n.meta.get("val")
    for v in (val if isinstance(val, (list, tuple)) else [val]):
        if isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape):
            return True
    return False


def _check_targets(graph: torch.fx.Graph) -> None:
    """Raise one ExportError listing every node that is not an ATen op/getitem.

    ATen ops the compiler refuses by design (random numbers, data-dependent shapes, complex
    numbers) are reported first, with the reason: their graphs often hold symbolic-size
    arithmetic or complex tensors that would otherwise fail with a less useful message.
    """
    refused = []
    for n in graph.nodes:
        t = n.target
        if n.op == "call_function" and isinstance(t, torch._ops.OpOverload) and t.namespace == "aten":
            why = _refusal(str(t))
            if not why and _data_dependent(n):
                why = ("its output shape depends on the input values (data-dependent shape, e.g. "
                       "boolean-mask indexing); Chroma compiles fixed shapes only")
            if why:
                refused.append(f"  - {t} (node {n.name}) at {source_of(n) or '<unknown source>'}: {why}")
    if refused:
        raise ExportError("the exported graph contains ATen ops that Chroma cannot compile:\n"
                          + "\n".join(refused))
    bad = []
    for n in graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        if n.op == "call_function":
            t = n.target
            if t is operator.getitem:
                continue
            if isinstance(t, torch._ops.OpOverload) and t.namespace == "aten":
                continue
            if isinstance(t, torch._ops.OperatorBase):
                what = str(t)  # e.g. mylib.op.default
            else:
                what = getattr(t, "__qualname__", None) or str(t)
                mod = getattr(t, "__module__", None)
                what = f"{mod}.{what}" if mod else what
        else:
            what = f"{n.op} {n.target}"
        bad.append(f"  - {what} (node {n.name}) at {source_of(n) or '<unknown source>'}")
    if bad:
        raise ExportError("the exported graph contains operations that are not "
                          "ATen ops:\n" + "\n".join(bad))


def _drop_error_checks(graph: torch.fx.Graph) -> None:
    """Remove ``aten._linalg_check_errors`` and the effect tokens that order it.

    torch.export wraps the check eager PyTorch runs after a factorization (raise on a
    singular or not positive-definite input) in ``higher_order.with_effects``, threaded by a
    token from an extra input to an extra output. A compiled program cannot raise, so the
    check is dropped: singular inputs give what LAPACK gives (the ``_ex`` variants return
    LAPACK's ``info`` exactly; see docs/linalg.md). The token input/output specs are skipped
    by the serializer.
    """
    check = getattr(torch.ops.aten, "_linalg_check_errors", None)
    for n in list(graph.nodes):
        if n.op != "call_function" or "with_effects" not in str(n.target):
            continue
        if len(n.args) < 2 or n.args[1] is not getattr(check, "default", None):
            continue
        for u in list(n.users):
            if u.target is operator.getitem and u.args[1] == 0:
                u.replace_all_uses_with(n.args[0])
                graph.erase_node(u)
        if not n.users:
            graph.erase_node(n)
    _drop_scalar_asserts(graph)


# Arithmetic and comparisons on symbolic ints (values read with Tensor.item()) that only feed
# the runtime assertions below.
_SYM_ARITH = {operator.ge, operator.gt, operator.le, operator.lt, operator.eq, operator.ne,
              operator.and_, operator.or_, operator.not_, operator.add, operator.sub, operator.mul,
              operator.neg, operator.floordiv, operator.mod}


def _prims_casts_to_aten(graph: torch.fx.Graph) -> None:
    """Rewrite ``prims.convert_element_type(x, dtype)`` as ``aten._to_copy(x, dtype=dtype)``.

    Some of torch's decompositions (renorm's, for instance) leave this primitive in the core
    ATen graph; it is a plain dtype conversion, exactly what ``_to_copy`` with only a dtype
    does, so the importer's cast handles it.
    """
    prims = getattr(torch.ops, "prims", None)
    op = getattr(getattr(prims, "convert_element_type", None), "default", None)
    if op is None:
        return
    for n in list(graph.nodes):
        if n.op == "call_function" and n.target is op:
            x, dtype = n.args[0], n.args[1] if len(n.args) > 1 else n.kwargs["dtype"]
            with graph.inserting_before(n):
                m = graph.call_function(torch.ops.aten._to_copy.default, (x,), {"dtype": dtype})
            m.meta = dict(n.meta)
            n.replace_all_uses_with(m)
            graph.erase_node(n)


def _drop_scalar_asserts(graph: torch.fx.Graph) -> None:
    """Remove the runtime assertions torch.export puts on values read with ``Tensor.item()``.

    Indexing with such a value (``x[i.item()]``, ``torch.take`` of a 0-d tensor) exports as
    ``_local_scalar_dense`` feeding ``select``, plus ``_assert_scalar`` nodes (and the symbolic
    arithmetic they test) for the bounds torch inferred. A compiled program cannot evaluate
    them; the op that consumes the value checks its own bounds instead (a Gather raises on an
    out-of-range index at run time). ``torch._check`` calls on such values are dropped too.
    """
    dropped = set()
    for name in ("_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size"):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            dropped.add(op.default)
    for n in list(graph.nodes):
        if n.op == "call_function" and n.target in dropped and not n.users:
            graph.erase_node(n)
    changed = True
    while changed:
        changed = False
        for n in reversed(list(graph.nodes)):
            if n.op == "call_function" and n.target in _SYM_ARITH and not n.users:
                graph.erase_node(n)
                changed = True


class _Serializer:
    """Turns an (already decomposed) ExportedProgram into graph JSON + blob."""

    def __init__(self, ep):
        self.extra_state: Tuple[str, ...] = ()
        self.state_updates: list = []
        self.weight_data: Optional[Callable[[str], Optional[torch.Tensor]]] = None
        self.widenings: list = []  # cast nodes of weights stored narrower than the model computes
        self.ep = ep
        self.getitems: Dict[str, Tuple[str, int]] = {}  # getitem node -> (parent, k)

    def ref(self, node: torch.fx.Node) -> dict:
        if node.name in self.getitems:
            parent, k = self.getitems[node.name]
            return {"ref": parent, "index": k}
        return {"ref": node.name}

    def arg(self, a: Any, where: str) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.ref(a)
        if isinstance(a, bool) or a is None:
            return a
        if isinstance(a, int):
            return int(a)
        if isinstance(a, float):
            if math.isnan(a):
                return {"float": "nan"}
            if math.isinf(a):
                return {"float": "inf" if a > 0 else "-inf"}
            return {"float": a}
        if isinstance(a, (list, tuple)):
            return [self.arg(x, where) for x in a]
        if isinstance(a, str):
            return {"str": a}
        if isinstance(a, torch.dtype):
            return {"dtype": _dtype_name(a, where)}
        if isinstance(a, torch.device):
            return {"device": str(a)}
        if isinstance(a, torch.layout) and a in _LAYOUTS:
            return {"layout": _LAYOUTS[a]}
        if isinstance(a, torch.memory_format) and a in _MEMORY_FORMATS:
            return {"memory_format": _MEMORY_FORMATS[a]}
        raise ExportError(f"{where} has an unsupported value {a!r} "
                          f"(type {type(a).__name__})")

    def state_targets(self) -> set:
        """Buffers the program updates in place (plus those named by the caller): state."""
        from torch.export.graph_signature import OutputKind
        mutated = {s.target for s in self.ep.graph_signature.output_specs
                   if s.kind == OutputKind.BUFFER_MUTATION}
        return mutated | set(self.extra_state)

    def weights(self) -> Tuple[list, bytes]:
        from torch.export.graph_signature import InputKind
        state = self.state_targets()
        kinds = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer",
                 InputKind.CONSTANT_TENSOR: "constant"}
        entries, pieces, seen, end = [], [], {}, 0
        for spec in self.ep.graph_signature.input_specs:
            if spec.kind == InputKind.USER_INPUT or spec.kind.name == "TOKEN":
                continue  # effect tokens: see _drop_error_checks
            if spec.kind not in kinds:
                raise ExportError(f"unsupported graph input {spec.arg} of kind "
                                  f"{spec.kind.name}")
            t = self.ep.state_dict.get(spec.target)
            if t is None:
                t = self.ep.constants.get(spec.target)
            if not isinstance(t, torch.Tensor):
                raise ExportError(f"weight {spec.target!r} is not a tensor")
            stored, name = self._stored(spec.target, spec.arg.name, t, spec.kind == InputKind.BUFFER and spec.target in state)
            dtype = _dtype_name(stored.dtype, f"weight {spec.target!r}")
            data = _tensor_bytes(stored)
            digest = hashlib.sha256(data).hexdigest()
            key = (dtype, digest)
            if key not in seen:  # deduplicate identical dtype+bytes
                seen[key] = graph_file.align(end)
                pieces.append((seen[key], data))
                end = seen[key] + len(data)
            kind = kinds[spec.kind]
            if spec.kind == InputKind.BUFFER and spec.target in state:
                kind = "state"
            entries.append({"name": name, "source": spec.target,
                            "kind": kind, "dtype": dtype,
                            "shape": _shape(t, f"weight {spec.target!r}"),
                            "offset": seen[key], "nbytes": len(data),
                            "sha256": digest})
        return entries, pieces, end

    def _stored(self, target: str, arg: str, t: torch.Tensor, state: bool):
        """The tensor whose bytes the file holds for weight `target` and the entry's name:
        weight_data's when it gives one (checked against the model's), else the model's own.
        A narrower stored type gets a cast node named like the weight (self.widenings)."""
        src = self.weight_data(target) if self.weight_data is not None else None
        if src is None:
            if _is_fake(t):
                raise ExportError(f"weight {target!r} has no data: the model was built without its weights "
                                  f"(structure_only) and weight_data gives none for it")
            return t, arg
        if _is_fake(src) or src.device.type != "cpu":
            raise ExportError(f"weight_data({target!r}) must give a CPU tensor with data, got {type(src).__name__} "
                              f"on {src.device}")
        if tuple(src.shape) != tuple(t.shape):
            raise ExportError(f"weight {target!r}: the file's tensor has shape {list(src.shape)}, the model's "
                              f"{list(t.shape)}")
        if src.dtype == t.dtype:
            return src, arg
        if not (t.dtype == torch.float32 and src.dtype in (torch.bfloat16, torch.float16)) or state:
            raise ExportError(f"weight {target!r} is stored as {src.dtype} and the model computes in {t.dtype}: "
                              f"only a bfloat16 or float16 weight (not state) widens exactly to float32")
        stored = f"{arg}__stored"
        self.widenings.append({"name": arg, "target": "aten._to_copy.default", "args": [{"ref": stored}],
                               "kwargs": {"dtype": {"dtype": "float32"}},
                               "outputs": [{"dtype": "float32", "shape": _shape(t, f"weight {target!r}")}],
                               "source": f"weight {target} ({_dtype_name(src.dtype, target)} in its file)"})
        return src, stored

    def outputs_of(self, n: torch.fx.Node) -> list:
        val = n.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else ([] if val is None else [val])
        out = []
        for k, v in enumerate(vals):
            if isinstance(v, torch.Tensor):
                what = f"output {k} of node {n.name}"
                out.append({"dtype": _dtype_name(v.dtype, what), "shape": _shape(v, what)})
            else:
                out.append(None)  # non-tensor result slot: keeps indices aligned
        return out

    def nodes(self) -> list:
        nodes = []
        for n in self.ep.graph.nodes:
            if n.op != "call_function":
                continue
            if n.target is operator.getitem:
                parent, k = n.args
                if parent.name in self.getitems or not isinstance(k, int):
                    raise ExportError(f"unsupported nested getitem {n.name} "
                                      f"at {source_of(n) or '<unknown source>'}")
                self.getitems[n.name] = (parent.name, k)
                continue
            where = f"node {n.name} ({n.target})"
            nodes.append({
                "name": n.name,
                "target": str(n.target),
                "args": [self.arg(a, f"{where} arg {i}") for i, a in enumerate(n.args)],
                "kwargs": {k: self.arg(v, f"{where} kwarg {k!r}")
                           for k, v in n.kwargs.items()},
                "outputs": self.outputs_of(n),
                "source": source_of(n),
            })
        return nodes

    def graph_outputs(self) -> Tuple[list, str]:
        from torch.export.graph_signature import OutputKind, TensorArgument
        spec = self.ep.call_spec.out_spec
        if spec is None or spec.is_leaf():
            structure = "single"
        elif (spec.type in (tuple, list) or (isinstance(spec.type, type) and issubclass(spec.type, tuple))) \
                and all(c.is_leaf() for c in spec.children()):
            # Named tuples (torch.return_types.topk, ...) come back as plain tuples.
            structure = "list" if spec.type is list else "tuple"
        else:
            raise ExportError(
                f"model output must be a tensor or a flat tuple/list of tensors; "
                f"got a {getattr(spec.type, '__name__', spec.type)} structure: {spec}")
        out_node = next(n for n in self.ep.graph.nodes if n.op == "output")
        by_name = {n.name: n for n in out_node.args[0] if isinstance(n, torch.fx.Node)}
        refs, mutated, self.state_updates = [], [], []
        user = [s for s in self.ep.graph_signature.output_specs
                if s.kind == OutputKind.USER_OUTPUT]
        for s in self.ep.graph_signature.output_specs:
            if s.kind == OutputKind.BUFFER_MUTATION:
                # The buffer becomes persistent state: the runtime keeps it between calls.
                upd = self.ref(by_name[s.arg.name])
                upd["state"] = s.target
                self.state_updates.append(upd)
            elif s.kind != OutputKind.USER_OUTPUT and s.kind.name != "TOKEN":
                mutated.append(f"{s.kind.name} {s.target}")
        for i, s in enumerate(user):
            if not isinstance(s.arg, TensorArgument):
                raise ExportError(f"output {i} is not a tensor "
                                  f"({getattr(s.arg, 'value', s.arg)!r})")
            refs.append(self.ref(by_name[s.arg.name]))
        if mutated:
            warnings.warn("chroma: the model mutates its inputs or parameters during forward ("
                          + ", ".join(mutated) + "); these updates are dropped.")
        return refs, structure


def export(model_or_function: Union[torch.nn.Module, Callable], example_inputs: tuple,
           path: Optional[str] = None, state: Tuple[str, ...] = (),
           weight_data: Optional[Callable[[str], Optional[torch.Tensor]]] = None) -> ExportedGraph:
    """Export a model (or function of tensors) to a Chroma graph.

    Args:
        model_or_function: an ``nn.Module`` (its current train/eval mode is
            kept: call ``.eval()`` first for inference) or a plain function
            taking and returning tensors.
        example_inputs: tuple of tensors; their shapes/dtypes are baked in.
        path: if given, the ``.cgraph`` file is written there.
        state: names (fully qualified) of buffers to treat as persistent state even if
            this program only reads them. Buffers the program updates in place are
            always state (a KV cache): the compiled program keeps and updates them.
        weight_data: where weights' bytes come from, by fully qualified name (a tensor, or
            None for the model's own): a model built without its weights (under
            ``structure_only()``: every parameter a FakeTensor) exports with its weights read
            from files (``safetensors_weights``), never all in memory. A weight stored as
            bfloat16 or float16 for a float32 model is written as stored and widened by a
            cast in the graph (exact).

    Returns: an :class:`ExportedGraph` (``.json``, ``.blob``, ``.write()``).
    Raises: :class:`ExportError` if torch.export fails, inputs/outputs are not
        tensors, a dtype is unsupported, or the graph holds non-ATen calls.
    """
    check_torch_version(torch.__version__)
    example_inputs = _check_inputs(example_inputs)
    module = model_or_function
    if not isinstance(module, torch.nn.Module):
        if not callable(module):
            raise ExportError(f"expected an nn.Module or a function, got "
                              f"{type(module).__name__}")
        module = _wrap_function(module)
    with _EXPORT_LOCK:  # one export at a time per process (_EXPORT_LOCK)
        example_inputs = _into_fake_mode(module, example_inputs)
        try:
            with warnings.catch_warnings():  # torch-internal pytree deprecation noise
                warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
                ep = torch.export.export(module, example_inputs, strict=False)
                ep = ep.run_decompositions(decompositions.table())
        except Exception as e:
            raise ExportError(f"torch.export failed: {type(e).__name__}: {e}") from e

    _drop_error_checks(ep.graph)
    _prims_casts_to_aten(ep.graph)
    _check_targets(ep.graph)
    ser = _Serializer(ep)
    ser.extra_state = tuple(state)
    ser.weight_data = weight_data
    weights, pieces, data_length = ser.weights()
    inputs = []
    from torch.export.graph_signature import InputKind
    user_specs = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    for i, (s, x) in enumerate(zip(user_specs, example_inputs)):
        inputs.append({"name": s.arg.name, "dtype": _dtype_name(x.dtype, f"input {i}"),
                       "shape": _shape(x, f"input {i}")})
    nodes = ser.widenings + ser.nodes()
    outputs, structure = ser.graph_outputs()
    graph = {
        "format": graph_file.FORMAT_NAME, "version": graph_file.FORMAT_VERSION,
        "producer": {"name": "chroma", "version": PRODUCER_VERSION,
                     "torch": torch.__version__},
        "inputs": inputs, "weights": weights, "nodes": nodes,
        "outputs": outputs, "output_structure": structure,
    }
    if ser.state_updates:
        graph["state_updates"] = ser.state_updates
    result = ExportedGraph(json=graph, pieces=pieces, data_length=data_length)
    if path is not None:
        result.write(path)
    return result

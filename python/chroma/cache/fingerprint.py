"""What a compile depends on, as one digest: the key of the model cache (model_cache.py).

A second ``chroma.compile`` of an unchanged model, in a new process, should not redo
torch.export (seconds) and Chroma's front end. The cache is keyed on everything the exported
graph and the build can depend on, computed without tracing:

- the model's object graph: every module's class (its methods' code and the globals that code
  names, recursively, down to torch's own functions, named by qualified name), every entry
  of every module's ``__dict__`` (attributes, hooks, flags such as ``training``), every
  parameter and buffer by dtype, shape, strides and the SHA-256 of its bytes; a plain
  function by its code, defaults, closure cells and the globals it names;
- the example inputs' dtypes, shapes and strides (not their values: torch.export traces
  with fake tensors, so the graph cannot depend on them);
- the contents of every Python source file loaded from outside the standard library and
  the installed packages (the user's own code), of Chroma's Python files, and of each file
  that defines a class or function met on the way; the version of each installed package
  met; the primitive and tensor attributes of the user's own modules (``config.SCALE = 3``
  set at run time);
- torch's and Python's versions, the default dtype, the grad mode, the compiler's options,
  the environment variables that change a build (``CHROMA_*``, ``CXX``), Chroma's compiler
  module and runtime headers (by size and modification time) and the CPU (``-march=native``).

Anything the walk cannot describe faithfully (a C object with no ``__dict__``, a tensor
subclass, a tensor on another device, more than 200 000 objects) raises Uncacheable, and the
compile goes the long way. What the key cannot see: state that Python code reads from outside
the objects it reaches (a file, an environment variable read inside ``forward``, a mutable
global of an installed package). ``cache_dir=""`` or ``CHROMA_MODEL_CACHE=0`` turn the
model cache off.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import platform
import sys
import sysconfig
import types
from typing import Any, Dict, Iterable

import numpy as np

from ..paths import file_digest, toolchain_digest

__all__ = ["Uncacheable", "compile_key"]

_MAX_OBJECTS = 200_000
_MAX_DEPTH = 200


class Uncacheable(Exception):
    """The model holds something the fingerprint cannot describe; compile without the cache."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what
        self.path: list = []

    def __str__(self) -> str:
        return self.what + (f" (at {'.'.join(reversed(self.path))})" if self.path else "")


def _installed_roots() -> tuple:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        import site

        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except Exception:  # pragma: no cover - embedded interpreters without site
        pass
    roots.add(os.path.dirname(os.__file__))
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


_ROOTS = None


def _roots() -> tuple:
    global _ROOTS
    if _ROOTS is None:
        _ROOTS = _installed_roots()
    return _ROOTS


def _is_installed(path: str) -> bool:
    return os.path.realpath(path).startswith(_roots())


_PRIMITIVES = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented), range)


class _Walker:
    def __init__(self, h: "hashlib._Hash"):
        self.h = h
        self.memo: Dict[int, int] = {}
        self.alive: list = []  # keeps walked objects alive so their ids stay unique
        self.files: Dict[str, str] = {}
        self.packages: Dict[str, str] = {}
        self.user_modules: Dict[str, types.ModuleType] = {}
        self._seen_classes: set = set()
        self.count = 0

    def emit(self, *parts: Any) -> None:
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode("utf-8", "surrogatepass")
            self.h.update(len(b).to_bytes(8, "little"))
            self.h.update(b)

    # -- where code comes from ------------------------------------------------------------
    def note_module(self, modname: Any) -> None:
        if not isinstance(modname, str) or not modname:
            return
        mod = sys.modules.get(modname)
        path = getattr(mod, "__file__", None) if mod is not None else None
        if path and path not in self.files:
            self.files[path] = file_digest(path)
        top = modname.split(".")[0]
        if top not in self.packages:
            topmod = sys.modules.get(top)
            self.packages[top] = str(getattr(topmod, "__version__", ""))
        if mod is not None and path and not _is_installed(path):
            self.user_modules[modname] = mod

    @staticmethod
    def from_torch(modname: Any) -> bool:
        return isinstance(modname, str) and (modname == "torch" or modname.startswith("torch."))

    # -- the walk -------------------------------------------------------------------------
    def obj(self, o: Any, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise Uncacheable("the model's object graph is too deep")
        self.count += 1
        if self.count > _MAX_OBJECTS:
            raise Uncacheable(f"the model holds more than {_MAX_OBJECTS} objects")
        t = type(o)
        if t in _PRIMITIVES:
            self.emit(t.__name__, repr(o))
            return
        oid = id(o)
        if oid in self.memo:
            self.emit("ref", self.memo[oid])
            return
        self.memo[oid] = len(self.memo)
        self.alive.append(o)
        import torch

        d = depth + 1
        if isinstance(o, torch.Tensor):
            self.tensor(o)
        elif isinstance(o, (torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format)):
            self.emit(t.__name__, repr(o))
        elif isinstance(o, enum.Enum):
            self.emit("enum", t.__module__, t.__qualname__, o.name)
            self.note_module(t.__module__)
        elif t in (tuple, list) or (isinstance(o, tuple) and hasattr(o, "_fields")):
            self.emit(t.__qualname__, len(o))
            if t not in (tuple, list):
                self.cls(t, d)
            for x in o:
                self.obj(x, d)
        elif isinstance(o, (dict, types.MappingProxyType)):
            self.emit("dict", t.__qualname__, len(o))
            if t not in (dict, types.MappingProxyType):
                self.cls(t, d)
            for k, v in list(o.items()):
                self.obj(k, d)
                try:
                    self.obj(v, d)
                except Uncacheable as e:
                    e.path.append(str(k))
                    raise
        elif t in (set, frozenset):
            items = list(o)
            if not all(type(x) in _PRIMITIVES for x in items):
                raise Uncacheable("a set of non-primitive values")
            self.emit(t.__name__, *sorted(repr(x) for x in items))
        elif t is slice:
            self.emit("slice")
            for x in (o.start, o.stop, o.step):
                self.obj(x, d)
        elif isinstance(o, np.ndarray):
            a = np.ascontiguousarray(o)
            self.emit("ndarray", a.dtype.str, a.shape)
            if a.dtype.hasobject:
                raise Uncacheable("a NumPy array of Python objects")
            self.emit(hashlib.sha256(a.view(np.uint8).reshape(-1) if a.size else b"").hexdigest())
        elif isinstance(o, np.generic):
            self.emit("npscalar", o.dtype.str, repr(o.item()))
        elif isinstance(o, torch.nn.Module):
            self.cls(t, d)
            self.obj(o.__dict__, d)
        elif isinstance(o, types.FunctionType):
            self.function(o, d)
        elif isinstance(o, types.MethodType):
            self.emit("method")
            self.obj(o.__func__, d)
            self.obj(o.__self__, d)
        elif isinstance(o, (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType,
                            types.MethodWrapperType, types.ClassMethodDescriptorType, types.GetSetDescriptorType,
                            types.MemberDescriptorType)):
            owner = getattr(o, "__self__", None)
            self.emit("builtin", getattr(o, "__module__", None), getattr(o, "__qualname__", repr(t)))
            if owner is not None and not isinstance(owner, (types.ModuleType, type)):
                self.obj(owner, d)
        elif isinstance(o, type):
            self.cls(o, d)
        elif isinstance(o, types.ModuleType):
            self.emit("module", o.__name__)
            self.note_module(o.__name__)
        elif isinstance(o, functools.partial):
            self.emit("partial")
            self.obj(o.func, d)
            self.obj(o.args, d)
            self.obj(o.keywords, d)
        elif isinstance(o, (staticmethod, classmethod)):
            self.emit(t.__name__)
            self.obj(o.__func__, d)
        elif isinstance(o, property):
            self.emit("property")
            for f in (o.fget, o.fset, o.fdel):
                self.obj(f, d)
        elif isinstance(o, types.CodeType):
            self.code(o, d)
        elif isinstance(o, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            self.emit("op", str(o))
        elif isinstance(o, (types.CellType,)):
            try:
                v = o.cell_contents
            except ValueError:
                self.emit("empty cell")
            else:
                self.obj(v, d)
        elif hasattr(o, "__dict__") or hasattr(t, "__slots__"):
            self.cls(t, d)
            if hasattr(o, "__dict__"):
                self.obj(vars(o), d)
            for c in t.__mro__:
                slots = c.__dict__.get("__slots__", ())
                for slot in ((slots,) if isinstance(slots, str) else slots):
                    self.emit("slot", slot)
                    self.obj(getattr(o, slot, None), d)
        else:
            raise Uncacheable(f"cannot describe an object of type {t.__module__}.{t.__qualname__}")

    def tensor(self, t: Any) -> None:
        import torch

        plain = {torch.Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", torch.Tensor)}
        if type(t) not in plain:
            raise Uncacheable(f"a tensor subclass ({type(t).__qualname__})")
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized or t.is_meta:
            raise Uncacheable(f"a tensor on {t.device} with layout {t.layout}")
        self.emit("tensor", type(t).__name__, t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.requires_grad,
                  t.is_conj(), t.is_neg())
        x = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
        self.emit(hashlib.sha256(x.view(torch.uint8).numpy() if x.numel() else b"").hexdigest())

    def cls(self, c: type, depth: int) -> None:
        self.emit("class", c.__module__, c.__qualname__)
        self.note_module(c.__module__)
        for b in c.__mro__:
            if b is object or self.from_torch(b.__module__) or b.__module__ == "builtins":
                continue
            if ("cls", id(b)) in self._seen_classes:
                self.emit("seen", b.__module__, b.__qualname__)
                continue
            self._seen_classes.add(("cls", id(b)))
            self.alive.append(b)
            self.note_module(b.__module__)
            for k, v in list(vars(b).items()):
                if k in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__"):
                    continue
                self.emit("attr", k)
                try:
                    self.obj(v, depth + 1)
                except Uncacheable as e:
                    e.path.append(f"{b.__qualname__}.{k}")
                    raise

    def function(self, f: types.FunctionType, depth: int) -> None:
        self.emit("function", f.__module__, f.__qualname__)
        if self.from_torch(f.__module__):
            return  # torch's own code: its version is in the key
        self.note_module(f.__module__)
        self.code(f.__code__, depth)
        self.obj(f.__defaults__, depth)
        self.obj(f.__kwdefaults__, depth)
        self.obj(f.__closure__, depth)
        g = f.__globals__
        for name in sorted(self.names(f.__code__)):
            if name in g:
                self.emit("global", name)
                try:
                    self.obj(g[name], depth)
                except Uncacheable as e:
                    e.path.append(f"{f.__qualname__}:{name}")
                    raise

    def names(self, code: types.CodeType) -> set:
        out = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                out |= self.names(c)
        return out

    def code(self, code: types.CodeType, depth: int) -> None:
        self.emit("code", code.co_name, code.co_code, code.co_names, code.co_varnames, code.co_freevars,
                  code.co_cellvars, code.co_argcount, code.co_kwonlyargcount, code.co_flags)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                self.code(c, depth + 1)
            else:
                self.obj(c, depth + 1)

    def user_module_state(self) -> None:
        """Primitive and tensor attributes of the user's own modules (set at run time, say)."""
        import torch

        for name in sorted(self.user_modules):
            for k, v in sorted(vars(self.user_modules[name]).items()):
                if k.startswith("__"):
                    continue
                if type(v) in _PRIMITIVES or isinstance(v, (torch.Tensor, np.ndarray)) or (
                        type(v) in (tuple, list) and all(type(x) in _PRIMITIVES for x in v)):
                    self.emit("module attr", name, k)
                    self.obj(v)


def _environment(h: "hashlib._Hash") -> None:
    import torch

    from ..version import __version__

    def emit(*parts):
        for p in parts:
            b = str(p).encode()
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)

    emit("chroma", __version__, "torch", torch.__version__, "python", sys.version, platform.machine(),
         "default dtype", torch.get_default_dtype(), "grad", torch.is_grad_enabled())
    for k in sorted(os.environ):
        if (k.startswith("CHROMA_") and k not in ("CHROMA_CACHE_DIR", "CHROMA_NUM_THREADS", "CHROMA_MODEL_CACHE",
                                                                 "CHROMA_MODEL_CACHE_BYTES")) or k == "CXX":
            emit("env", k, os.environ[k])
    # The CPU (-march=native) and the compiler: its module and runtime headers, and the Python files here.
    
    emit("toolchain", toolchain_digest())
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(os.path.join(here, n) for n in os.listdir(here) if n.endswith(".py")):
        emit(os.path.basename(path), file_digest(path))


def compile_key(models: Iterable[tuple], options: Dict[str, Any]) -> str:
    """The model cache's key for compiling [(name, model_or_function, example_inputs), ...]."""
    import torch

    h = hashlib.sha256()
    _environment(h)
    w = _Walker(h)
    w.emit("options", repr(sorted(options.items())))
    for name, fn, inputs in models:
        w.emit("entry", name, len(inputs))
        for x in inputs:
            if type(x) is not torch.Tensor:
                raise Uncacheable(f"an example input is a {type(x).__qualname__}, not a plain tensor "
                                  "(a tensor subclass can change what is traced)")
            w.emit("input", x.dtype, tuple(x.shape), x.stride(), x.requires_grad)
        w.obj(fn)
    w.user_module_state()
    # Files: the user's own code wherever it is, Chroma's, and each file met on the way.
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and not _is_installed(path):
            w.files.setdefault(path, file_digest(path))
    for path in sorted(w.files):
        w.emit("file", path, w.files[path])
    for top in sorted(w.packages):
        w.emit("package", top, w.packages[top])
    return h.hexdigest()

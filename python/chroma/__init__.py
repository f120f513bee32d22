"""Chroma: an ahead-of-time compiler and runtime for fixed-shape PyTorch models.

    prog = chroma.compile(model, (x,), out="build/mlp")   # needs torch
    y = prog(x.numpy())
    prog = chroma.load("build/mlp")                       # needs only NumPy

Importing this package never imports torch; only compile(), jit() and export() do.
"""

import os as _os
import sys as _sys

from .cpuinfo import configure_blas as _configure_blas
from .cpuinfo import info

# Before anything loads OpenBLAS: its AVX-512/AVX2 kernels on CPUs it does not recognize.
_configure_blas()

if _os.environ.get("CHROMA_COMPILER_LIBRARY"):
    # Test hook (scripts/sanitize.sh): use this build of the compiler extension, e.g. one
    # built with ASan and UBSan, instead of the installed one.
    import importlib.machinery as _m
    import importlib.util as _u

    _loader = _m.ExtensionFileLoader("chroma._compiler", _os.environ["CHROMA_COMPILER_LIBRARY"])
    _spec = _u.spec_from_file_location("chroma._compiler", _os.environ["CHROMA_COMPILER_LIBRARY"], loader=_loader)
    _sys.modules["chroma._compiler"] = _u.module_from_spec(_spec)
    _loader.exec_module(_sys.modules["chroma._compiler"])

from .decoder import Decoder  # noqa: E402
from .errors import ArtifactError  # noqa: E402
from .runtime.cpu import Entry, Program  # noqa: E402
from .runtime.registry import load  # noqa: E402
from .version import __version__  # noqa: E402
__all__ = ["info", "compile", "compile_entries", "compile_decoder", "load", "jit", "export", "Program", "Entry", "Decoder",
           "quant_report", "ArtifactError", "CompileError", "UnsupportedError", "__version__"]


def compile(model_or_function, example_inputs, *, out=None, target="cpu", blas=True, **options):  # noqa: A001
    """Compiles a torch.nn.Module or a function of tensors for fixed example inputs.

    Returns a loaded Program. See chroma.compiler.compile for the options.
    """
    from .compiler import compile as _compile

    return _compile(model_or_function, example_inputs, out=out, target=target, blas=blas, **options)


def compile_entries(entries, *, out=None, **options):
    """Compiles {name: (module_or_function, example_inputs)} into one artifact with one entry
    point each, sharing weights and persistent state. See chroma.compiler.compile_entries."""
    from .compiler import compile_entries as _ce

    return _ce(entries, out=out, **options)


def compile_decoder(model, *, prompt_len, cache_size, out=None, threads=None, **options):
    """Compiles a model's prefill/step pair (``model.make_decoder(cache_size)``) into a Decoder."""
    from .decoder import compile_decoder as _cd

    return _cd(model, prompt_len=prompt_len, cache_size=cache_size, out=out, threads=threads, **options)


def quant_report(model, example_inputs, *, weights="q4", sensitivity=True, top=20):
    """A dry run of weights=: bytes per layer and in total, and the layers ranked by the output
    error each causes alone (see chroma.quantization.quant.quant_report)."""
    from .quantization.quant import quant_report as _qr

    return _qr(model, example_inputs, weights=weights, sensitivity=sensitivity, top=top)


def jit(fn_or_module=None, **options):
    """Compiles on first call and keeps one program per input shapes and dtypes."""
    from .jitting import jit as _jit

    return _jit(fn_or_module, **options)


def export(model_or_function, example_inputs, path=None):
    """Exports a model to a Chroma graph file (see docs/graph_format.md)."""
    from .frontend.exporter import export as _export

    return _export(model_or_function, example_inputs, path)


def __getattr__(name):
    if name in ("CompileError", "UnsupportedError"):
        from . import _compiler

        return getattr(_compiler, name)
    raise AttributeError(name)

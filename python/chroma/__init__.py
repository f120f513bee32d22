"""Chroma: an ahead-of-time compiler and runtime for fixed-shape PyTorch models.

    prog = chroma.compile(model, (x,), out="build/mlp")   # needs torch
    y = prog(x.numpy())
    prog = chroma.load("build/mlp")                       # needs only NumPy

Importing this package never imports torch; only compile(), jit() and export() do.
"""

from .program import ArtifactError, Program, load

__version__ = "0.1.0"
__all__ = ["compile", "load", "jit", "export", "Program", "ArtifactError", "CompileError", "__version__"]


def compile(model_or_function, example_inputs, *, out=None, target="cpu", blas=True, **options):  # noqa: A001
    """Compiles a torch.nn.Module or a function of tensors for fixed example inputs.

    Returns a loaded Program. See chroma.compiler.compile for the options.
    """
    from .compiler import compile as _compile

    return _compile(model_or_function, example_inputs, out=out, target=target, blas=blas, **options)


def jit(fn_or_module=None, **options):
    """Compiles on first call and keeps one program per input shapes and dtypes."""
    from .jitting import jit as _jit

    return _jit(fn_or_module, **options)


def export(model_or_function, example_inputs, path=None):
    """Exports a model to a Chroma graph file (see docs/graph_format.md)."""
    from .exporter import export as _export

    return _export(model_or_function, example_inputs, path)


def __getattr__(name):
    if name == "CompileError":
        from ._compiler import CompileError

        return CompileError
    raise AttributeError(name)

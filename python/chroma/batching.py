"""Batch ranges: one artifact that answers a batch of any size (chroma.compile(batch=(lo, hi))).

Chroma compiles fixed shapes. A batch range is compiled as one artifact with an entry point
per batch size of a ladder (chroma/runtime/batched.py: lo, the powers of two between, hi),
built by compile_entries, so every weight is stored once (identical tensors are stored once
in weights.bin; a product whose weights are laid out one way for few rows and another for
many has each layout once) and the entries share the loaded program's weights in memory. A
call runs the sizes that cover its rows (runtime/batched.py, `plan`). Every row's result is
the one a program compiled for that batch gives, because the model was checked to treat
rows independently before anything was compiled (chroma/frontend/batch_rows.py: refused
with the node and source line otherwise).
"""

from __future__ import annotations

from typing import Any

from .runtime.batched import BatchedProgram, entry_name, ladder, write_info

__all__ = ["BatchedProgram", "batch_range", "compile_batch_range", "example_rows", "ladder"]


def batch_range(batch: Any) -> Tuple[int, int]:
    """(lo, hi) from `batch` (an int n: (1, n); a pair (lo, hi)); ValueError when invalid."""
    if isinstance(batch, bool):
        raise ValueError(f"batch={batch!r}: give the largest batch (an int) or a range (lo, hi)")
    if isinstance(batch, int):
        lo, hi = 1, batch
    elif isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                      for v in batch):
        lo, hi = batch
    else:
        raise ValueError(f"batch={batch!r}: give the largest batch (an int) or a range (lo, hi) of ints")
    if not 1 <= lo <= hi:
        raise ValueError(f"batch={batch!r}: need 1 <= lo <= hi")
    if hi > 1 << 20:
        raise ValueError(f"batch={batch!r}: at most {1 << 20} rows")
    return lo, hi


def example_rows(x: Any, n: int) -> Any:
    """The example input with n rows (its own rows, repeated as needed)."""
    import torch

    if x.shape[0] >= n:
        return x[:n].clone()
    reps = -(-n // x.shape[0])
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:n].clone()


def compile_batch_range(compile_entries: Any, model: Any, example_inputs: tuple, batch: Any, *,
                        out: str, **options: Any) -> BatchedProgram:
    """chroma.compile(batch=...): checks rows are independent, compiles the ladder."""
    from .frontend.batch_rows import check_rows

    lo, hi = batch_range(batch)
    for i, x in enumerate(example_inputs):
        if not hasattr(x, "dim") or x.dim() == 0 or x.shape[0] < 1:
            raise ValueError(f"batch={batch!r}: input {i} has no batch dimension (dimension 0 of every input)")
        if x.shape[0] != example_inputs[0].shape[0]:
            raise ValueError(f"batch={batch!r}: input {i} has {x.shape[0]} rows, input 0 has "
                             f"{example_inputs[0].shape[0]}: every input's dimension 0 is the batch")
    check_rows(model, example_inputs, hi)
    sizes = ladder(lo, hi)
    entries = {entry_name(s): (model, tuple(example_rows(x, s) for x in example_inputs)) for s in sizes}
    prog = compile_entries(entries, out=out, **options)
    info = write_info(out, lo, hi, sizes)
    return BatchedProgram(prog, info)

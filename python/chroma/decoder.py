"""chroma.Decoder: autoregressive decoding with a KV cache kept inside the runtime.

A decoder artifact has two entry points that share one copy of the weights and the cache:

    prefill(tokens [P] int64)              -> logits [P, V]; resets the cache, fills rows 0..P-1
    step(token [1] int64, position [1] int64) -> logits [1, V]; writes row position % C

The cache is persistent state of the loaded program (see docs/artifact_format.md): no step
copies it through Python. ``chroma.compile_decoder`` builds such an artifact from a model
that provides ``make_decoder(cache_size)`` (see chroma.models.gpt_oss.GptOss).
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Union

import numpy as np

from .errors import ArtifactError
from .runtime.cpu import Program
from .runtime.registry import load

__all__ = ["Decoder", "compile_decoder"]


class Decoder:
    """Greedy or step-by-step decoding on a loaded prefill/step artifact."""

    def __init__(self, program: Program):
        names = [e.name for e in program.entries]
        if "prefill" not in names or "step" not in names:
            raise ArtifactError(f"{program.directory}: not a decoder artifact (entries {names}; "
                                "expected 'prefill' and 'step')")
        self.program = program
        self._prefill = program.entry("prefill")
        self._step = program.entry("step")
        self.prompt_len = int(self._prefill.inputs[0].shape[0])
        self.vocab_size = int(self._step.outputs[0].shape[-1])
        self.position = 0
        self._token = np.zeros(1, np.int64)
        self._pos = np.zeros(1, np.int64)

    @classmethod
    def load(cls, directory: Union[str, os.PathLike], *, threads: Optional[int] = None) -> "Decoder":
        return cls(load(directory, threads=threads))

    def prefill(self, tokens: Any) -> np.ndarray:
        """Starts a new sequence: ``tokens`` [prompt_len] int64; returns logits [prompt_len, V]."""
        tokens = np.asarray(tokens)
        if tokens.shape != (self.prompt_len,):
            raise ValueError(f"prefill: expected {self.prompt_len} prompt tokens (the compiled prompt length), "
                             f"got shape {list(tokens.shape)}")
        logits = self._prefill(tokens.astype(np.int64, copy=False))
        self.position = self.prompt_len
        return logits

    def step(self, token: int, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Feeds one token at the current position; returns its logits [1, V]."""
        if self.position < self.prompt_len:
            raise RuntimeError("step() before prefill(): start a sequence with prefill(prompt)")
        self._token[0] = int(token)
        self._pos[0] = self.position
        res = self._step(self._token, self._pos, out=out)
        self.position += 1
        return res

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> List[int]:
        """Greedy decoding: the prompt, then ``max_new_tokens`` argmax tokens."""
        logits = self.prefill(np.asarray(prompt, dtype=np.int64))
        nxt = int(np.argmax(logits[-1]))
        out = [nxt]
        for _ in range(max_new_tokens - 1):
            nxt = int(np.argmax(self.step(nxt)[0]))
            out.append(nxt)
        return out


def compile_decoder(model: Any, *, prompt_len: int, cache_size: int, out: Optional[str] = None,
                    threads: Optional[int] = None, **options: Any) -> Decoder:
    """Compiles ``model.make_decoder(cache_size)`` into a prefill/step artifact and loads it."""
    import torch

    from .compiler import compile_entries

    if prompt_len < 1 or prompt_len > cache_size:
        raise ValueError(f"prompt_len={prompt_len} must be between 1 and cache_size={cache_size}")
    if not hasattr(model, "make_decoder"):
        raise TypeError(f"{type(model).__name__} has no make_decoder(cache_size) method")
    prefill, step = model.make_decoder(cache_size)
    tokens = torch.zeros(prompt_len, dtype=torch.int64)
    token = torch.zeros(1, dtype=torch.int64)
    position = torch.tensor([prompt_len], dtype=torch.int64)
    prog = compile_entries({"prefill": (prefill, (tokens,)), "step": (step, (token, position))},
                           out=out, threads=threads, **options)
    return Decoder(prog)

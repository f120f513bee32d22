"""Tokenization and text embeddings.

The T5 tokenizer is the directory's own (tokenizer/tokenizer.json read with the `tokenizers`
library, no torch; transformers' AutoTokenizer where there is only spiece.model). A prompt
becomes its real tokens, EOS included, truncated to 512 as diffusers truncates; T5 encodes
them plus ONE padding token (whose own key is masked, as in diffusers' padded batch), and the
transformer sees exactly those n + 1 embeddings (hard masking: every other padding position
is removed, not given a 0/1 float mask that diffusers' SDPA adds to the scores). A prompt of
512 tokens has no padding token left (diffusers' mask has none either).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["Tokenizer", "TextEmbedding", "save_text_embeds", "load_text_embeds", "MAX_TOKENS", "bucket_for"]

MAX_TOKENS = 512
BUCKETS = (64, 128, 256, 512)


def bucket_for(n: int, buckets: Tuple[int, ...] = BUCKETS) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} tokens exceed the largest length bucket {buckets[-1]}")


class Tokenizer:
    def __init__(self, directory: str):
        self.directory = directory
        path = os.path.join(directory, "tokenizer.json")
        self._fast = None
        self._hf = None
        if os.path.isfile(path):
            from tokenizers import Tokenizer as _Tok

            self._fast = _Tok.from_file(path)
            self.eos_id = self._fast.token_to_id("</s>")
            self.pad_id = self._fast.token_to_id("<pad>")
        else:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(directory)
            self.eos_id, self.pad_id = self._hf.eos_token_id, self._hf.pad_token_id
        self.dropped = 0
        if self.eos_id is None or self.pad_id is None:
            raise ValueError(f"{directory}: the tokenizer has no </s> or <pad> token (a T5 tokenizer has both)")

    def __call__(self, prompt: str) -> List[int]:
        """The prompt's token ids, EOS last, at most MAX_TOKENS."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt: expected a string, not {type(prompt).__name__}")
        if self._fast is not None:
            ids = self._fast.encode(prompt, add_special_tokens=False).ids
        else:
            ids = self._hf(prompt, add_special_tokens=False)["input_ids"]
        self.dropped = max(0, len(ids) - (MAX_TOKENS - 1))  # tokens truncation dropped (diffusers drops them too)
        return list(ids[: MAX_TOKENS - 1]) + [self.eos_id]

    def encoder_input(self, ids: List[int], length: int) -> Tuple[np.ndarray, np.ndarray, int]:
        """(input_ids [1, length], attention_mask [1, length], n_keep): the tokens, then padding
        tokens up to `length`; the mask covers the real tokens; the first n_keep outputs are the
        text embeddings (the real tokens and one padding token)."""
        n = len(ids)
        x = np.full((1, length), self.pad_id, dtype=np.int64)
        x[0, :n] = ids
        m = np.zeros((1, length), dtype=np.int64)
        m[0, :n] = 1
        return x, m, min(n + 1, MAX_TOKENS)


@dataclasses.dataclass
class TextEmbedding:
    """A prompt's text embeddings [tokens, D] (its real tokens and one padding token)."""
    prompt: str
    embeds: np.ndarray
    tokens: int  # real tokens, EOS included

    def __len__(self) -> int:
        return int(self.embeds.shape[0])


def save_text_embeds(path: str, prompt: TextEmbedding, negative: Optional[TextEmbedding],
                     info: Dict[str, Any]) -> str:
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    arrays = {"prompt_embeds": prompt.embeds.astype(np.float32), "prompt": np.array(prompt.prompt),
              "prompt_tokens": np.array(prompt.tokens)}
    if negative is not None:
        arrays.update({"negative_embeds": negative.embeds.astype(np.float32), "negative": np.array(negative.prompt),
                       "negative_tokens": np.array(negative.tokens)})
    for k, v in info.items():
        arrays[f"info_{k}"] = np.array(str(v))
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def load_text_embeds(path: str, dim: int) -> Tuple[TextEmbedding, Optional[TextEmbedding], Dict[str, str]]:
    """(prompt, negative or None, info) from a file save_text_embeds wrote; dim: the
    transformer's text width (joint_attention_dim), checked."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--text-embeds {path}: no such file")
    with np.load(path, allow_pickle=False) as z:
        if "prompt_embeds" not in z:
            raise ValueError(f"{path}: no 'prompt_embeds' array (not a file --save-text-embeds wrote)")
        out = []
        for key in ("prompt", "negative"):
            if f"{key}_embeds" not in z:
                out.append(None)
                continue
            e = np.asarray(z[f"{key}_embeds"], dtype=np.float32)
            if e.ndim != 2 or e.shape[1] != dim or not 1 <= e.shape[0] <= MAX_TOKENS:
                raise ValueError(f"{path}: {key}_embeds has shape {list(e.shape)}; this model needs [tokens <= "
                                 f"{MAX_TOKENS}, {dim}]")
            out.append(TextEmbedding(str(z[key]), e, int(z[f"{key}_tokens"])))
        info = {k[5:]: str(z[k]) for k in z.files if k.startswith("info_")}
    return out[0], out[1], info

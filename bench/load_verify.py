"""Load-time verification speed: how fast chroma.load checks an artifact's weights.

    .venv/bin/python bench/load_verify.py [--mb 512] [--repeats 5]

Compiles a model whose weights take about --mb MB (a stack of constant 2048x2048 linear
layers, so most of the artifact is weights), then times `chroma.load` (which reads
weights.bin into memory and checks its sha256-tree-16MiB digest on the program's threads)
with 1 and 2 threads, and the digest alone: Chroma's (OpenSSL SHA-256 per 16 MiB chunk, in
the library) and, for scale, one plain SHA-256 pass in Python's hashlib (also OpenSSL).
Prints GB/s and seconds per GB; writes bench/results/load_verify.json.
"""

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import torch  # noqa: E402

import chroma  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _child_load(directory, threads, repeats):
    """Median seconds of chroma.load in a fresh process (no warm library state)."""
    code = (f"import sys, time, statistics; sys.path.insert(0, {os.path.join(HERE, '..', 'python')!r})\n"
            f"import chroma\nts = []\n"
            f"for _ in range({repeats}):\n"
            f"    t = time.perf_counter(); p = chroma.load({directory!r}, threads={threads}); ts.append(time.perf_counter() - t)\n"
            f"    del p\n"
            f"print(statistics.median(ts))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    layers = max(1, round(a.mb * 2**20 / (2048 * 2048 * 4)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False) for _ in range(layers)]).eval()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "big")
        x = torch.randn(64, 2048)  # 64 rows: the products use BLAS on the weights as stored
        chroma.compile(model, (x,), out=d)
        wpath = os.path.join(d, "weights.bin")
        nbytes = os.path.getsize(wpath)
        with open(wpath, "rb") as f:
            data = f.read()  # page cache warm for every measurement below
        rows = []
        for threads in (1, 2):
            s = _child_load(d, threads, a.repeats)
            rows.append({"what": f"chroma.load, {threads} thread(s) (read + verify)", "seconds": s})
        ts = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            hashlib.sha256(data).hexdigest()
            ts.append(time.perf_counter() - t)
        rows.append({"what": "plain SHA-256, hashlib (OpenSSL), 1 thread", "seconds": statistics.median(ts)})
    gb = nbytes / 1e9
    print(f"weights: {nbytes / 2**20:.0f} MiB; {platform.processor() or platform.machine()}")
    print(f"{'measurement':52s} {'seconds':>9s} {'GB/s':>7s} {'s/GB':>6s}")
    for r in rows:
        r["gb_per_s"] = gb / r["seconds"]
        r["seconds_per_gb"] = r["seconds"] / gb
        print(f"{r['what']:52s} {r['seconds']:9.3f} {r['gb_per_s']:7.2f} {r['seconds_per_gb']:6.2f}")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "load_verify.json"), "w") as f:
        json.dump({"weights_bytes": nbytes, "rows": rows, "info": chroma.info()}, f, indent=2)


if __name__ == "__main__":
    main()

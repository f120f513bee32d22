"""Unit sizes (docs/architecture.md, "Conventions"): no source file over 800 lines and no function
over 150, in the compiler, the runtimes and the Python package. Lengths are lizard's (a
language-aware function finder: https://github.com/terryyin/lizard), counted from a function's
first line to its last. Generated files (scripts/gen_package_format.py, scripts/fit_gpu_special.py)
are tables, not units, and are left out."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TREES = ["src", "include", "python/chroma", "python/bindings.cpp", "web/src", "tools", "scripts"]
GENERATED = {"include/chroma/package_format.h", "python/chroma/runtime/package_format.py", "web/src/package_format.ts",
             "src/codegen/gpu/special_fits.h"}
SUFFIXES = (".cpp", ".h", ".cu", ".py", ".ts", ".mjs")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 800, 150


def _sources():
    out = []
    for t in TREES:
        path = os.path.join(ROOT, t)
        if os.path.isfile(path):
            out.append(t)
            continue
        for d, _, files in os.walk(path):
            for f in files:
                rel = os.path.relpath(os.path.join(d, f), ROOT)
                if f.endswith(SUFFIXES) and rel not in GENERATED and "node_modules" not in rel:
                    out.append(rel)
    return sorted(out)


def test_no_source_file_over_800_lines():
    long = []
    for rel in _sources():
        with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
            n = sum(1 for _ in f)
        if n > MAX_FILE_LINES:
            long.append(f"{rel}: {n} lines")
    assert not long, "split these along their seams:\n" + "\n".join(long)


def test_no_function_over_150_lines():
    pytest.importorskip("lizard", reason="lizard (requirements.txt) measures function lengths")
    files = [os.path.join(ROOT, r) for r in _sources()]
    p = subprocess.run([sys.executable, "-m", "lizard", "--csv", *files], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and p.stdout, p.stderr[-2000:]
    long = []
    for line in p.stdout.splitlines():
        cols = line.split(",")
        if len(cols) > 7 and cols[4].isdigit() and int(cols[4]) > MAX_FUNCTION_LINES:
            where = cols[5].strip(chr(34)).rsplit("@", 2)
            long.append(f"{os.path.relpath(where[-1], ROOT)}:{where[-2]} {where[0]}: {cols[4]} lines")
    assert not long, "split these along their seams:\n" + "\n".join(sorted(long))

"""Runs the golden IR files in tests/golden/: IR text in, the passes named on the `// RUN:`
line, `// CHECK:` lines matched in order against the printed result (`// CHECK-NOT:` must not
appear). Also checks that print() and parse() round-trip."""

import glob
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

from chroma import _compiler  # noqa: E402
from test_golden_ir import filecheck  # noqa: E402

GOLDEN = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "golden", "*.ir")))


def directives(text):
    run = re.search(r"^// RUN: (.*)$", text, re.M)
    assert run, "a golden file needs a // RUN: line"
    checks = [m.group(1) + ": " + m.group(2) for m in re.finditer(r"^// (CHECK(?:-NOT)?): (.*)$", text, re.M)]
    assert checks, "a golden file needs CHECK lines"
    return run.group(1).split(), checks


@pytest.mark.parametrize("path", GOLDEN, ids=[os.path.basename(p) for p in GOLDEN])
def test_golden_file(path):
    text = open(path).read()
    passes, checks = directives(text)
    filecheck(_compiler.run_ir(text, passes), checks)


@pytest.mark.parametrize("path", GOLDEN, ids=[os.path.basename(p) for p in GOLDEN])
def test_print_parse_round_trip(path):
    text = open(path).read()
    once = _compiler.run_ir(text, [])
    assert _compiler.run_ir(once, []) == once


def test_parse_errors_name_the_line():
    with pytest.raises(_compiler.CompileError, match=r"IR text line 3:.*unknown op 'Bogus'"):
        _compiler.run_ir("graph {\n  %0 = Input() {name=\"x\"} : f32[2]\n  %1 = Bogus(%0) : f32[2]\n  return %1\n}", [])
    with pytest.raises(_compiler.CompileError, match=r"declared types do not match"):
        _compiler.run_ir("graph {\n  %0 = Input() : f32[2]\n  %1 = Map.neg(%0) : f32[3]\n  return %1\n}", [])
    with pytest.raises(_compiler.CompileError, match=r"%5 is not defined"):
        _compiler.run_ir("graph {\n  %0 = Input() : f32[2]\n  %1 = Map.neg(%5) : f32[2]\n  return %1\n}", [])

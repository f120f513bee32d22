"""chroma.info() and the OpenBLAS core choice (chroma/cpuinfo.py, chroma/cpu/blas_env.h)."""

import os
import subprocess
import sys

import pytest

from chroma import cpuinfo

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_core_for_features():
    avx512 = ["avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx2", "fma"]
    if cpuinfo.platform.machine() != "x86_64":
        pytest.skip("the OpenBLAS cores chosen here are x86-64 ones")
    assert cpuinfo.blas_core_for(avx512) == "SkylakeX"
    assert cpuinfo.blas_core_for(["avx2", "fma", "avx"]) == "Haswell"
    assert cpuinfo.blas_core_for(["avx512f", "avx2", "fma"]) == "Haswell"  # AVX-512 without BW/VL/DQ
    assert cpuinfo.blas_core_for(["sse4_2"]) is None


def _child(code, env):
    r = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {os.path.join(ROOT, 'python')!r})\n" + code],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_selects_the_core_before_openblas_loads():
    want = cpuinfo.blas_core_for(cpuinfo.cpu_features())
    if want is None:
        pytest.skip("this CPU has neither AVX2+FMA nor AVX-512: OpenBLAS's own choice stands")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    got = _child("import chroma, chroma._compiler; print(chroma.info()['blas']['core'])", env)
    assert got.lower() == want.lower()
    # a user's own setting is respected
    env["OPENBLAS_CORETYPE"] = "Prescott"
    got = _child("import chroma, chroma._compiler; print(chroma.info()['blas']['core'])", env)
    assert got.lower() == "prescott"


def test_info_names_the_kernels():
    i = cpuinfo.info()
    assert i["cores"] >= 1 and i["cpu"]
    assert i["blas"]["library"] == "OpenBLAS" and i["blas"]["core"]
    assert i["onednn"]["library"] == "oneDNN" and i["onednn"]["isa"]
    out = subprocess.run([sys.executable, "-m", "chroma", "info"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "BLAS: OpenBLAS core" in out.stdout and "oneDNN" in out.stdout, out.stderr


def test_openmp_workers_wait_passively_unless_the_user_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _child("import os, chroma; print(os.environ['OMP_WAIT_POLICY'])", env) == "PASSIVE"
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    assert _child("import os, chroma; print(os.environ['OMP_WAIT_POLICY'])", env) == "ACTIVE"

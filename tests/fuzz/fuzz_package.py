"""A mutation fuzzer for the Python GPU package reader (chroma.runtime.package), for a bounded
time: `python tests/fuzz/fuzz_package.py SECONDS [OUT_DIR]` (scripts/fuzz.sh runs it).

Seeds: the test writer's packages (tests/python/webgpu_fixture.py: float, integer, state and
golden-data packages). Each round mutates one seed in one of these ways and reads it:
  - a manifest field (chosen at random along the JSON tree) replaced by a hostile value (huge,
    negative, fractional, of the wrong type, deeply nested), deleted, or a list duplicated,
    with the digest recomputed so the deeper checks are reached;
  - bytes of the manifest text flipped, digest recomputed;
  - bytes of the header or payload flipped, digest left alone.
The reader must either accept the file or raise PackageError. Anything else (another
exception, a hang past the per-input time, a crash) is a finding: the input is written to
OUT_DIR (default build/fuzz/artifacts/package) and the run exits 1. A mutant the reader
accepts is also loaded and run on a software WebGPU adapter when one is available (lavapipe),
where it must run or fail with PackageError or RunError; the input is written to
OUT_DIR/current before that, so a crash leaves it behind.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import numpy as np  # noqa: E402

import webgpu_fixture as fx  # noqa: E402

from chroma.errors import PackageError, RunError  # noqa: E402
from chroma.runtime.package import read_package  # noqa: E402

HOSTILE = [-1, 0, 1, 3, 255, 256, 2 ** 31, 2 ** 32 + 4, 2 ** 53, 2 ** 53 + 1, 2 ** 63, 2 ** 64, 1e308, -1e308, 0.5,
           1e-300, True, False, None, "", "x" * 300, "arena", "weights", "state", "uniform", "storage", [], {},
           [0], [1, 1, 1], [65535, 65535, 1], [2 ** 31, 1, 1], {"binding": 0}, [[[[[[[[[[[]]]]]]]]]]]]
PER_INPUT_SECONDS = 10


def seeds() -> list:
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3) / 4
    w = np.linspace(-1, 2, 6).astype(np.float32)
    return [fx.affine_package(x, w),
            fx.ints_package(np.array([1, 0, 4, 2], np.int64), np.array([5, -7, 300, 0, -9, 1], np.int64),
                            np.arange(5, dtype=np.float32)),
            fx.state_package(np.array([1, 2, 3], np.float32), np.full(3, 0.5, np.float32))]


def split(data: bytes):
    ms = int.from_bytes(data[24:32], "little")
    po = int.from_bytes(data[32:40], "little")
    m = json.loads(data[96:96 + ms])
    m["content_hash"] = "0" * 64
    return m, bytes(data[po:])


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


def mutate_field(rng: random.Random, data: bytes) -> bytes:
    m, payload = split(data)
    targets = [p for p in paths(m) if p and p[-1] != "content_hash"]
    path = rng.choice(targets)
    parent = m
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    r = rng.random()
    if r < 0.1 and isinstance(parent, dict):
        del parent[key]
    elif r < 0.2 and isinstance(parent[key], list) and parent[key]:
        parent[key] = parent[key] + parent[key][:1]
    elif r < 0.3 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        parent[key] = parent[key] + rng.choice([-256, -4, -1, 1, 4, 256, 1 << 20])
    else:
        parent[key] = rng.choice(HOSTILE)
    return fx.assemble(json.dumps(m).encode(), payload)


def mutate_text(rng: random.Random, data: bytes) -> bytes:
    m, payload = split(data)
    text = bytearray(json.dumps(m).encode())
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(text))
        text[i] = rng.choice(b'0123456789-.,:[]{}"eE \\x')
    return fx.assemble(bytes(text), payload)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(96) if rng.random() < 0.5 else rng.randrange(len(b))
        b[i] = rng.randrange(256)
    if rng.random() < 0.1:
        b = b[:rng.randrange(len(b))]
    return bytes(b)


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def adapter():
    icd = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
    if not os.path.exists(icd):
        return None
    os.environ.setdefault("VK_ICD_FILENAMES", icd)
    try:
        import chroma.runtime.webgpu  # noqa: F401  (loads Triton first where it is installed)
        import wgpu

        return wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception:  # noqa: BLE001 - no WebGPU here: the reader alone is fuzzed
        return None


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join("build", "fuzz", "artifacts", "package")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(int(os.environ.get("CHROMA_FUZZ_SEED", time.time_ns() & 0xFFFFFFFF)))
    corpus = seeds()
    gpu = adapter()
    signal.signal(signal.SIGALRM, _alarm)
    stats = {"inputs": 0, "accepted": 0, "ran": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seed = rng.choice(corpus)
        kind = rng.random()
        data = mutate_field(rng, seed) if kind < 0.6 else mutate_text(rng, seed) if kind < 0.8 else mutate_bytes(rng, seed)
        stats["inputs"] += 1
        signal.alarm(PER_INPUT_SECONDS)
        try:
            pkg = read_package(data)
            stats["accepted"] += 1
            if gpu is not None and pkg.dialect == "wgsl":
                with open(os.path.join(out, "current"), "wb") as f:  # left behind if the run crashes
                    f.write(data)
                from chroma.runtime.webgpu import WebGPUProgram

                try:
                    prog = WebGPUProgram(pkg, adapter=gpu)
                    try:
                        prog(*[np.zeros(t.shape, t.dtype) for t in prog.inputs])
                        stats["ran"] += 1
                    finally:
                        prog.close()
                except (PackageError, RunError):
                    pass
        except PackageError:
            pass
        except BaseException as e:  # noqa: BLE001 - every other outcome is a finding
            signal.alarm(0)
            name = os.path.join(out, f"finding-{stats['inputs']}.chroma-web")
            with open(name, "wb") as f:
                f.write(data)
            what = "a hang" if isinstance(e, Hang) else f"{type(e).__name__}: {e}"
            print(f"[fuzz] fuzz_package: {what} on {name}", file=sys.stderr)
            traceback.print_exc()
            return 1
        finally:
            signal.alarm(0)
    current = os.path.join(out, "current")
    if os.path.exists(current):
        os.remove(current)
    print(f"[fuzz] fuzz_package: {stats['inputs']} inputs, {stats['accepted']} accepted by the reader, "
          f"{stats['ran']} ran on {'lavapipe' if gpu is not None else 'no adapter'}: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())

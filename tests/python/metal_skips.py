"""The Metal backend's skip list: tests of the shared op suite (the `check` fixture) that the
metal target does not run on the CPU SIMT emulator, each with its reason (conftest.py applies
it when CHROMA_TEST_TARGET=metal). A substring of the test's node id (or a tuple of
substrings that must all appear in it) -> why.

The Metal target prints the GPU generator's kernels in its MSL dialect with the same limits
and storage rules as WebGPU (docs/cuda.md, "Limits today"), so it refuses what WebGPU
refuses, at compile time and naming the op; those entries are WebGPU's list. (MSL has no
float64 either.)"""

from webgpu_skips import SKIPS as _GENERATOR_LIMITS

SKIPS = dict(_GENERATOR_LIMITS)

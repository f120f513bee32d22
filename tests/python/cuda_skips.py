"""The CUDA backend's skip list: tests of the shared op suite (the `check` fixture) that the
cuda target does not run on the CPU SIMT emulator, each with its reason (conftest.py applies
it when CHROMA_TEST_TARGET=cuda). A substring of the test's node id (or a tuple of substrings
that must all appear in it) -> why.

The CUDA target prints the GPU generator's kernels in its CUDA dialect with the same
capability record and storage rules as WebGPU (docs/cuda.md, "Limits today"), so it refuses
what WebGPU refuses, at compile time and naming the op; those entries are WebGPU's list."""

from webgpu_skips import SKIPS as _GENERATOR_LIMITS

SKIPS = dict(_GENERATOR_LIMITS)

"""The WebGPU backend's skip list: tests of the shared op suite (the `check` fixture) that
the webgpu target does not run, each with its reason (conftest.py applies it when
CHROMA_TEST_TARGET=webgpu). A substring of the test's node id (or a tuple of substrings that
must all appear in it) -> why. Every skipped case
fails at compile time with a CompileError naming the op and source line (tests/python/
test_webgpu.py checks those messages), never with a wrong result."""

_INT64 = ("int64 values beyond the int32 range: the GPU target computes integers in 32-bit words "
          "(docs/webgpu_package.md, 'Storage'); the runtimes refuse such inputs with a clear error")
_CPU = "inspects a CPU lowering choice (pre-packed panels, BLAS, the CPU manifest), not the op's result"
_F64 = "float64 tensors (or a decomposition that computes in float64): WGSL has no f64; refused at compile time"

SKIPS = {
    "test_ops.py::test_int64_exact_beyond_float_precision": _INT64,
    "test_ops.py::test_int64_trunc_div_exact_beyond_float_precision": _INT64,
    "test_ops.py::test_arange_large_int64_start": _INT64,
    "test_ops.py::test_shifts_and_gcd[dtype0]": _INT64 + " (int64 shifts by 32 or more bits)",
    "test_core_ops.py::test_cumsum_integers_promote_to_int64_and_are_exact": _INT64,
    "test_ops.py::test_packed_constant_matmul": _CPU,
    "test_ops.py::test_linear_model_blas_false": _CPU,
    "test_channels_last.py::test_post_op_chains": _CPU + " (oneDNN post-ops)",
    "test_channels_last.py::test_epilogue_regions": _CPU + " (oneDNN epilogues)",
    "test_matmul_gathered.py::test_gathered_expert_products_read_the_weights_in_place": (
        "asserts the CPU's gathered-product kernel; the GPU lowering has none yet: the gathered expert weights "
        "are copied by a gather kernel and then multiplied (the result is still checked before the assertion)"),
    "test_conv.py::test_float64": _F64,
    "test_extra_ops.py::test_antialiased_resize": _F64,
    "test_extra_ops.py::test_integer_linspace_matches_the_cpu_kernel": _F64,
    "test_vision_ops.py::test_avg_pool_and_integer_pooling": _F64,
    ("test_special_ops.py::", "[dtype1]"): _F64 + " (the float64 half of a dtype-parametrized test)",
    "test_special_ops.py::test_mvlgamma": _F64 + " (the test's float64 reference, multigammaln of x.double())",
    "test_special_ops.py::test_round_decimals": _F64 + " (the test's float64 outputs)",
    "test_special_ops.py::test_signbit_angle": _F64 + " (the test's float64 outputs)",
}

// CUDA C++: the dialect table. Params are kernel arguments; shared arrays live in the body.
#include "codegen/gpu/printer.h"

namespace chroma::gpu {

Dialect c_family_dialect() {
  Dialect x;
  x.types[0] = "float";
  x.types[1] = "int";
  x.types[3] = "bool";
  x.let = "const {type} {name} = {value};";
  x.var = "{type} {name} = {value};";
  x.var_zero = "{type} {name} = {type}(0);";
  x.array = "{type} {name}[{count}];";
  x.assign = "{name} = {value};";
  x.assign_elem = "{name}[{index}] = {value};";
  x.for_open = "for (int {name} = {begin}; {name} < {end}; {name} += {step}) {";
  x.if_open = "if ({cond}) {";
  x.else_open = "} else {";
  x.close = "}";
  x.brk = "break;";
  x.ret = "return;";
  x.int_lit = "{0}";
  x.uint_lit = "{0}u";
  x.float_lit = "{0}f";
  x.load_global = "s{slot}[{0}]";
  x.store_global = "s{slot}[{0}] = {1};";
  x.arg_separator = ", ";
  x.shared_in_body = true;
  // Warps / SIMD-groups of 32 lanes over consecutive local indices.
  x.subgroup_prologue = "  const int sg_size = 32;\n  const int sg_lane = lid & 31;\n";
  return x;
}

const Dialect& cuda_dialect() {
  static const Dialect d = [] {
    Dialect x = c_family_dialect();
    x.name = "cuda";
    x.types[2] = "unsigned";
    x.barrier = "__syncthreads();";
    x.convert = "(({type})({0}))";
    x.bitcast = "chroma_bitcast<{type}>({0})";
    x.nonfinite_float = "chroma_bitcast<float>({0})";
    x.store_bits = "atomicAnd(&s{slot}[{0}], ~{mask}); atomicOr(&s{slot}[{0}], {1});";
    x.param = "((int)p{0})";
    x.shift_amount = "((unsigned)({0}))";
    x.float_remainder = "fmodf({0}, {1})";
    x.builtins = {
        {"select", "(({2}) ? ({1}) : ({0}))"},
        {"exp", "expf({0})"}, {"exp2", "exp2f({0})"}, {"log", "logf({0})"}, {"log2", "log2f({0})"},
        {"sqrt", "sqrtf({0})"}, {"rsqrt", "rsqrtf({0})"}, {"sin", "sinf({0})"}, {"cos", "cosf({0})"},
        {"tan", "tanf({0})"}, {"asin", "asinf({0})"}, {"acos", "acosf({0})"}, {"atan", "atanf({0})"},
        {"atan2", "atan2f({0}, {1})"}, {"sinh", "sinhf({0})"}, {"cosh", "coshf({0})"}, {"tanh", "tanhf({0})"},
        {"asinh", "asinhf({0})"}, {"acosh", "acoshf({0})"}, {"atanh", "atanhf({0})"}, {"floor", "floorf({0})"},
        {"ceil", "ceilf({0})"}, {"round", "rintf({0})"}, {"trunc", "truncf({0})"}, {"fma", "fmaf({0}, {1}, {2})"},
        {"pow", "powf({0}, {1})"}, {"abs", "chroma_abs({0})"}, {"min", "chroma_min({0}, {1})"},
        {"max", "chroma_max({0}, {1})"},
        // Subgroup reductions over the 32-lane warp (butterfly of shuffles: every lane gets the
        // result); the generator only calls them with whole warps active.
        {"subgroupAdd", "chroma_warp_add({0})"}, {"subgroupMul", "chroma_warp_mul({0})"},
        {"subgroupMax", "chroma_warp_max({0})"}, {"subgroupMin", "chroma_warp_min({0})"},
    };
    x.binding_params = "";
    x.params_field = "unsigned p{0}";
    // CHROMA_SLOT(T): `T* __restrict__` for nvcc, a bounds-checked slot on the emulator
    // (the translation unit's header defines it; include/chroma/simt/simt.h, "storage slots").
    x.binding_rw = "CHROMA_SLOT(unsigned) s{slot}";
    x.binding_ro = "CHROMA_SLOT(const unsigned) s{slot}";
    x.shared_decl = "__shared__ {type} {name}[{count}];";
    x.kernel_open = "extern \"C\" __global__ void __launch_bounds__({wgsize}) chroma_{name}({args}) {";
    x.prologue = "  const int lid = (int)threadIdx.x;\n  const int wg = (int)(blockIdx.x + blockIdx.y * {grid_x}u);\n";
    x.prelude =
        "template <class T, class F> __device__ __forceinline__ T chroma_bitcast(F f) { "
        "static_assert(sizeof(T) == sizeof(F)); T t; memcpy(&t, &f, sizeof t); return t; }\n"
        "template <class T> __device__ __forceinline__ T chroma_abs(T a) { return a < T(0) ? -a : a; }\n"
        "template <class T> __device__ __forceinline__ T chroma_min(T a, T b) { return b < a ? b : a; }\n"
        "template <class T> __device__ __forceinline__ T chroma_max(T a, T b) { return a < b ? b : a; }\n"
        "template <class T> __device__ __forceinline__ T chroma_warp_add(T v) { "
        "for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, o); return v; }\n"
        "template <class T> __device__ __forceinline__ T chroma_warp_mul(T v) { "
        "for (int o = 16; o > 0; o >>= 1) v = v * __shfl_xor_sync(0xffffffffu, v, o); return v; }\n"
        "template <class T> __device__ __forceinline__ T chroma_warp_max(T v) { "
        "for (int o = 16; o > 0; o >>= 1) v = chroma_max(v, __shfl_xor_sync(0xffffffffu, v, o)); return v; }\n"
        "template <class T> __device__ __forceinline__ T chroma_warp_min(T v) { "
        "for (int o = 16; o > 0; o >>= 1) v = chroma_min(v, __shfl_xor_sync(0xffffffffu, v, o)); return v; }\n";
    return x;
  }();
  return d;
}

}  // namespace chroma::gpu

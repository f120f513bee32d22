// Metal Shading Language: the dialect table. Storage is `device uint*` with an address space on
// every pointer; parameters are one `constant` struct; the thread and threadgroup positions are
// kernel arguments. Math as the generator spells it (min/max/abs through the prelude, so NaN
// behaves as in the other dialects); the host compiles with fast math off.
#include "codegen/gpu/printer.h"

namespace chroma::gpu {

const Dialect& msl_dialect() {
  static const Dialect d = [] {
    Dialect x = c_family_dialect();
    x.name = "msl";
    x.types[2] = "uint";
    x.barrier = "threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);";
    x.convert = "static_cast<{type}>({0})";
    x.bitcast = "as_type<{type}>({0})";
    x.nonfinite_float = "as_type<float>({0})";
    x.store_bits =
        "atomic_fetch_and_explicit(reinterpret_cast<device atomic_uint*>(&s{slot}[{0}]), ~{mask}, memory_order_relaxed); "
        "atomic_fetch_or_explicit(reinterpret_cast<device atomic_uint*>(&s{slot}[{0}]), {1}, memory_order_relaxed);";
    x.param = "((int)prm.p{0})";
    x.shift_amount = "((uint)({0}))";
    x.float_remainder = "precise::fmod({0}, {1})";
    // Transcendental functions spelled metal::precise:: so that their accuracy does not depend
    // on the host's compile options (MSL's default fast-math mode picks the fast:: variants).
    x.builtins = {
        {"select", "select({0}, {1}, {2})"}, {"round", "rint({0})"}, {"abs", "chroma_abs({0})"},
        {"min", "chroma_min({0}, {1})"}, {"max", "chroma_max({0}, {1})"},
        {"exp", "precise::exp({0})"}, {"exp2", "precise::exp2({0})"}, {"log", "precise::log({0})"},
        {"log2", "precise::log2({0})"}, {"sqrt", "precise::sqrt({0})"}, {"rsqrt", "precise::rsqrt({0})"},
        {"sin", "precise::sin({0})"}, {"cos", "precise::cos({0})"}, {"tan", "precise::tan({0})"},
        {"asin", "precise::asin({0})"}, {"acos", "precise::acos({0})"}, {"atan", "precise::atan({0})"},
        {"atan2", "precise::atan2({0}, {1})"}, {"sinh", "precise::sinh({0})"}, {"cosh", "precise::cosh({0})"},
        {"tanh", "precise::tanh({0})"}, {"asinh", "precise::asinh({0})"}, {"acosh", "precise::acosh({0})"},
        {"atanh", "precise::atanh({0})"}, {"pow", "precise::pow({0}, {1})"},
        // SIMD-group (32-lane) reductions: every lane gets the result.
        {"subgroupAdd", "simd_sum({0})"}, {"subgroupMul", "simd_product({0})"},
        {"subgroupMax", "simd_max({0})"}, {"subgroupMin", "simd_min({0})"},
    };
    x.params_struct_open = "struct Params {";
    x.params_field = " uint p{0};";
    x.params_struct_close = " };\n";
    x.binding_params = "constant Params& prm [[buffer({binding})]]";
    // CHROMA_SLOT(T): `T*` for Metal, a bounds-checked slot on the emulator (defined by the
    // translation unit's header; include/chroma/simt/simt.h, "storage slots").
    x.binding_rw = "CHROMA_SLOT(device uint) s{slot} [[buffer({binding})]]";
    x.binding_ro = "CHROMA_SLOT(device const uint) s{slot} [[buffer({binding})]]";
    x.shared_decl = "threadgroup {type} {name}[{count}];";
    x.kernel_open =
        "[[max_total_threads_per_threadgroup({wgsize})]] kernel void chroma_{name}({args}, "
        "uint3 chroma_tid [[thread_position_in_threadgroup]], uint3 chroma_wgid [[threadgroup_position_in_grid]]) {";
    x.prologue = "  const int lid = (int)chroma_tid.x;\n  const int wg = (int)(chroma_wgid.x + chroma_wgid.y * {grid_x}u);\n";
    x.prelude =
        "template <class T> inline T chroma_abs(T a) { return a < T(0) ? -a : a; }\n"
        "template <class T> inline T chroma_min(T a, T b) { return b < a ? b : a; }\n"
        "template <class T> inline T chroma_max(T a, T b) { return a < b ? b : a; }\n";
    return x;
  }();
  return d;
}

}  // namespace chroma::gpu

// WGSL (WebGPU): the dialect table. Storage is `array<u32>`; typed values are bit casts.
#include "codegen/gpu/printer.h"

namespace chroma::gpu {

const Dialect& wgsl_dialect() {
  static const Dialect d = [] {
    Dialect x;
    x.name = "wgsl";
    x.types[0] = "f32";
    x.types[1] = "i32";
    x.types[2] = "u32";
    x.types[3] = "bool";
    x.let = "let {name}: {type} = {value};";
    x.var = "var {name}: {type} = {value};";
    x.var_zero = "var {name}: {type};";
    x.array = "var {name}: array<{type}, {count}>;";
    x.assign = "{name} = {value};";
    x.assign_elem = "{name}[{index}] = {value};";
    x.for_open = "for (var {name}: i32 = {begin}; {name} < {end}; {name} += {step}) {";
    x.if_open = "if ({cond}) {";
    x.else_open = "} else {";
    x.close = "}";
    x.barrier = "workgroupBarrier();";
    x.brk = "break;";
    x.ret = "return;";
    x.convert = "{type}({0})";
    x.bitcast = "bitcast<{type}>({0})";
    x.int_lit = "{0}i";
    x.uint_lit = "{0}u";
    x.float_lit = "{0}f";
    // Not a const-expression: WGSL rejects an infinite or NaN constant (Tint evaluates
    // bitcast<f32>(0x7f800000u) at compile time and fails), a user function call is not one.
    x.nonfinite_float = "chroma_f32_bits({0})";
    x.load_global = "s{slot}[{0}]";
    x.store_global = "s{slot}[{0}] = {1};";
    x.binding_atomic = "@group(0) @binding({binding}) var<storage, read_write> s{slot}: array<atomic<u32>>;";
    x.load_global_atomic = "atomicLoad(&s{slot}[{0}])";
    x.store_global_atomic = "atomicStore(&s{slot}[{0}], {1});";
    x.store_bits = "atomicAnd(&s{slot}[{0}], ~{mask}); atomicOr(&s{slot}[{0}], {1});";
    x.param = "i32(prm.p{0})";
    x.shift_amount = "u32({0})";
    x.builtins = {
        {"select", "select({0}, {1}, {2})"},
        {"rsqrt", "inverseSqrt({0})"},
    };
    x.params_struct_open = "struct Params {";
    x.params_field = " p{0}: u32,";
    x.params_struct_close = " }\n";
    x.binding_params = "@group(0) @binding({binding}) var<uniform> prm: Params;";
    x.binding_rw = "@group(0) @binding({binding}) var<storage, read_write> s{slot}: array<u32>;";
    x.binding_ro = "@group(0) @binding({binding}) var<storage, read> s{slot}: array<u32>;";
    x.shared_decl = "var<workgroup> {name}: array<{type}, {count}>;";
    x.kernel_open =
        "@compute @workgroup_size({wgsize})\n"
        "fn {name}(@builtin(local_invocation_index) lidx: u32, @builtin(workgroup_id) wgid: vec3<u32>{extra}) {";
    x.prologue = "  let lid = i32(lidx);\n  let wg = i32(wgid.x + wgid.y * {grid_x}u);\n";
    x.prelude = "fn chroma_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }\n";
    x.subgroup_enable = "enable subgroups;\n";
    x.subgroup_args = ", @builtin(subgroup_size) sgsize: u32, @builtin(subgroup_invocation_id) sglane: u32";
    x.subgroup_prologue = "  let sg_size = i32(sgsize);\n  let sg_lane = i32(sglane);\n";
    return x;
  }();
  return d;
}

}  // namespace chroma::gpu

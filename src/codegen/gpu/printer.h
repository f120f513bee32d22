// Dialect printers (docs/gpu_generator.md, "Layers", D): a kernel IR module is
// printed by one generic printer driven by a table of spellings. A dialect is data: type names,
// literal and declaration syntax, builtin spellings, the binding syntax, barrier and prelude.
// Adding a dialect is adding a table (dialect_*.cpp), never a branch in the printer.
#pragma once

#include <map>
#include <string>

#include "codegen/gpu/kir.h"

namespace chroma::gpu {

struct Dialect {
  std::string name;                 // "wgsl", "cuda", "msl"
  std::string types[4];             // by Ty: f32, i32, u32, bool
  // Declarations; placeholders {name} {type} {value} {count}.
  std::string let, var, var_zero, array, assign, assign_elem;
  // for (var {name} = {begin}; {name} < {end}; {name} += {step}) {
  std::string for_open;
  std::string if_open, else_open, close;  // "if ({cond}) {", "} else {", "}"
  std::string barrier, brk, ret;
  // Expressions; {0} {1} {2} are operands, {type} the result type.
  std::string convert, bitcast;
  std::string int_lit, uint_lit, float_lit;  // {0}: digits (float: shortest exact decimal)
  std::string nonfinite_float;               // infinity or NaN from its bits: {0} (a u32 literal)
  std::string load_global;   // {slot} {0}: index (an i32 expression)
  std::string store_global;  // {slot} {0} index {1} value
  // Atomic slots (Slot::atomic): binding, load and store; empty: as the plain ones.
  std::string binding_atomic, load_global_atomic, store_global_atomic;
  // A bit-field store: {slot} {0} word index (printed twice: templates pass a name) {1} bits
  // {mask} (u32).
  std::string store_bits;
  std::string param;         // {0}: param number
  std::string shift_amount;  // converts an i32 shift amount: {0}
  // Float `%` (truncated remainder, WGSL's operator) where the language has no float `%`:
  // {0} % {1}. Empty: the operator as it is.
  std::string float_remainder;
  // Builtin calls by generic name ({0}, {1}, {2} are the arguments); a name not listed is
  // printed as name({0}, ...).
  std::map<std::string, std::string> builtins;
  // The module: {params_struct} {bindings} {shared} {name} {wgsize} {body} {grid_x}
  // {kernel_args}; binding lines formatted per slot.
  std::string params_struct_open, params_field, params_struct_close;
  std::string binding_rw, binding_ro, binding_params;  // {binding} {slot}
  std::string shared_decl;   // {name} {type} {count}
  bool shared_in_body = false;  // CUDA and MSL declare shared arrays inside the kernel
  std::string kernel_open;   // {name} {wgsize} {args}
  std::string arg_separator;
  std::string prologue;      // declares lid and wg: {grid_x}
  std::string prelude;       // helper functions printed once per module
  // Kernels with subgroup operations: the directive that enables them (printed first), the
  // kernel arguments ({extra} in kernel_open) and the prologue declaring sg_size (uniform)
  // and sg_lane; an empty prologue: the dialect has none.
  std::string subgroup_enable, subgroup_args, subgroup_prologue;
};

const Dialect& wgsl_dialect();
const Dialect& cuda_dialect();
const Dialect& msl_dialect();

// The spellings CUDA and MSL share as C++ dialects (declarations, control flow, literals,
// plain global loads and stores); each table sets the rest.
Dialect c_family_dialect();

// Prints one kernel as a complete module of the dialect. Binding numbers: 0 is the params
// (when the kernel has any), then one per slot in order.
std::string print_kernel(const Kernel& k, const Dialect& d);

}  // namespace chroma::gpu

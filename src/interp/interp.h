// The reference interpreter: dense, straightforward kernels for every IR primitive.
//
// Constant folding (src/passes/) evaluates nodes whose inputs are all known through
// eval_node(); tests run whole graphs through run() to get expected values. Correctness is
// the goal, speed only matters enough to fold tensors of about a million elements.
//
// Semantics follow the comments in src/ir/ops.def, with these details:
//   Map       applies the chroma/elementwise.def expression (shared with the generated code
//             through chroma/cpu/scalar.h) in the operands' dtype, then static_casts to the
//             output dtype. Integer floor_divide/remainder/fmod by zero throw CompileError
//             (PyTorch raises ZeroDivisionError; the generated code has the same check), and
//             x / -1 is evaluated without the hardware trap on INT_MIN / -1.
//   Cast      C conversions (float -> int truncates toward zero; -> bool is != 0). Float values
//             that do not fit the integer type (NaN, inf, overflow) give what x86 gives: the
//             minimum of int64 for int64, else the minimum of int32, narrowed modulo 2^bits.
//   Full      attrs.scalar converted to the dtype like Cast.
//   Iota      attrs.scalar + sum_k attrs.coeffs[k] * i_k computed in double, then converted.
//   Reduce    sum/prod accumulate in double for float types and modulo 2^64 for integers;
//             on bool, sum is any and prod is all. max/min propagate NaN. An empty sum is 0,
//             an empty product 1, an empty max/min throws CompileError.
//   ArgReduce the first index of the max/min; a NaN counts as the extreme (first NaN wins).
//   MatMul    accumulates in double for float types, modulo 2^64 for integers.
//   Gather / GatherElements throw CompileError for indices outside [0, size) (no negative
//             wrap-around: the importer normalizes indices it can see).
//   TopK      values and int64 indices; NaN is the largest value; ties go to the lower index.
//             The result is always sorted, also when attrs.sorted is false.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ir/graph.h"

namespace chroma::interp {

// A dense row-major tensor. `bytes` is shared and never mutated once the tensor exists, so
// copies are cheap and reshapes share storage.
struct Tensor {
  TensorType type;
  BlobPtr bytes;  // at least type.nbytes() bytes

  template <class T> const T* data() const { return reinterpret_cast<const T*>(bytes->data()); }

  // A tensor of `t` with every byte zero.
  static Tensor zeros(TensorType t);
  // Wraps a graph constant; shares its bytes.
  static Tensor from_constant(const ConstantData& c);
  // Builds a tensor from host values (test and tool convenience); values.size() must equal
  // t.numel() and T must be the C++ type of t.dtype.
  template <class T> static Tensor of(TensorType t, const std::vector<T>& values) {
    std::vector<uint8_t> buf(static_cast<size_t>(t.nbytes()));
    for (size_t i = 0; i < values.size() && i < static_cast<size_t>(t.numel()); ++i) {
      reinterpret_cast<T*>(buf.data())[i] = values[i];
    }
    return Tensor{std::move(t), make_blob(std::move(buf))};
  }
  // Copies the elements out as a std::vector<T> (T must be the C++ type of type.dtype).
  template <class T> std::vector<T> to_vector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + type.numel());
  }
};

// Evaluates node `id` of `g` given dense values for each of its inputs (in order); returns
// one Tensor per output. Throws chroma::CompileError naming the node (g.describe(id)) for
// out-of-range indices, integer division by zero, inputs whose types differ from the graph's,
// and Input nodes (which have no value outside run()).
std::vector<Tensor> eval_node(const Graph& g, int32_t id, const std::vector<Tensor>& inputs);

// Runs the whole graph (inputs in g.inputs order) and returns the graph outputs. Input nodes
// take their data from `inputs`, Constant nodes from g.constants. Only nodes the outputs
// depend on are evaluated, and intermediate values are released after their last use.
std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& inputs);

}  // namespace chroma::interp

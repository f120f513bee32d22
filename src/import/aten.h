// The ATen handler table: maps each ATen target ("aten.add.Tensor") onto IR primitives,
// directly or by decomposition. Handlers are grouped by op family, one file each
// (aten_elementwise.cpp, aten_shape.cpp, aten_reduce.cpp, aten_linalg.cpp, aten_index.cpp,
// aten_conv.cpp, aten_pool.cpp, aten_norm.cpp, aten_misc.cpp, aten_scatter.cpp,
// aten_sampling.cpp, aten_search.cpp, aten_backward.cpp, aten_extra.cpp, aten_special.cpp,
// aten_lapack.cpp).
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "import/builder.h"

namespace chroma {

using json = nlohmann::json;

// One exported ATen call: its positional args and kwargs in the graph file's ARG encoding
// (docs/graph_format.md), plus accessors that decode them with errors naming the argument.
class Call {
 public:
  Call(const json& node, Builder& b, const std::unordered_map<std::string, std::vector<Value>>& values);
  const std::string& target() const { return target_; }
  // Positional arg `i`, else kwarg `name`; nullptr when absent or None.
  const json* get(size_t i, const char* name) const;
  bool has(size_t i, const char* name) const { return get(i, name) != nullptr; }

  Value tensor(size_t i, const char* name) const;
  // Lists come back as checked vectors (ir/dtype.h): indexing past the end is a CompileError.
  CheckedVector<Value> tensors(size_t i, const char* name) const;        // list of tensors
  CheckedVector<std::optional<Value>> opt_tensors(size_t i, const char* name) const;  // list with None
  bool is_tensor(size_t i, const char* name) const;
  int64_t int_(size_t i, const char* name) const;
  int64_t int_or(size_t i, const char* name, int64_t dflt) const;
  double float_or(size_t i, const char* name, double dflt) const;
  bool bool_or(size_t i, const char* name, bool dflt) const;
  Scalar scalar(size_t i, const char* name) const;
  Shape ints(size_t i, const char* name) const;
  std::optional<DType> dtype(size_t i, const char* name) const;
  std::string str_or(size_t i, const char* name, const std::string& dflt) const;
  Operand operand(size_t i, const char* name) const;  // tensor or scalar
  // Output `k` type as recorded by the exporter.
  TensorType out_type(size_t k = 0) const;

  [[noreturn]] void fail(const std::string& msg) const;
  // A node the importer fused into this one (an inference batch norm that is a convolution's
  // only reader, folded into its weights): the fused node as a Call, or nullopt.
  std::optional<Call> fused() const;
  void set_fused(const json* node) { fused_ = node; }
  Builder& b;

 private:
  const json& node_;
  std::string target_;
  const std::unordered_map<std::string, std::vector<Value>>& values_;
  const json* fused_ = nullptr;
  Value ref(const json& j, const char* name) const;
};

using Handler = std::function<std::vector<Value>(Call&)>;
using HandlerTable = std::map<std::string, Handler>;

void register_aten_elementwise(HandlerTable& t);
void register_aten_shape(HandlerTable& t);
void register_aten_reduce(HandlerTable& t);
void register_aten_linalg(HandlerTable& t);
void register_aten_index(HandlerTable& t);
void register_aten_conv(HandlerTable& t);   // convolution (plain, grouped, depthwise, transposed)
void register_aten_pool(HandlerTable& t);   // pooling, padding modes
void register_aten_upsample(HandlerTable& t);  // nearest / linear upsampling, 1-3 spatial dims
void register_aten_norm(HandlerTable& t);   // batch / group (and so instance) normalization
void register_aten_misc(HandlerTable& t);   // scans, sorting, order statistics, strided views, the rest of core ATen
void register_aten_scatter(HandlerTable& t);   // scatter, scatter_add, scatter_reduce, masked_scatter
void register_aten_sampling(HandlerTable& t);  // embedding bags and renorm, cdist / pdist, grid_sampler_2d
void register_aten_search(HandlerTable& t);  // searchsorted, bucketize, histograms, nonzero_static, dist
void register_aten_backward(HandlerTable& t);  // col2im, convolution / embedding / layer and group norm backward
void register_aten_extra(HandlerTable& t);     // index_reduce, segment_reduce, grid_sampler_3d, unfold, *_copy views (after the views)
void register_aten_special(HandlerTable& t);  // special functions, hypot/ldexp/frexp/nextafter/signbit/angle
void register_aten_lapack(HandlerTable& t);  // LAPACK-backed factorizations and what decomposes over them

// beta * input + alpha * prod for the add* matrix products (addmm, baddbmm, addmv, addbmm), with
// beta and alpha read from args 3 and 4 (aten_linalg.cpp).
Value scaled_add(Call& c, Value input, Value prod);

// All handlers, built once.
const HandlerTable& aten_handlers();

}  // namespace chroma

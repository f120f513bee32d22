// Reference kernel for Linalg: the same LAPACK calls as the generated code
// (include/chroma/cpu/linalg.h), so constant folding and run time agree bit for bit.
#include "chroma/cpu/linalg.h"
#include "interp/kernels.h"

namespace chroma::interp {

Tensors eval_Linalg(const Node& n, const Tensors& in) {
  const Shape& xs = in[0].type.shape;
  const int64_t batch = extent(xs, 0, xs.size() - 2);
  int64_t dims[6] = {0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < in.size() && i < 3; ++i) {
    const Shape& s = in[i].type.shape;
    const size_t r = s.size();
    const bool vector = i > 0 && r == xs.size() - 1;  // tau: [batch..., k]
    dims[2 * i] = vector ? 1 : s[r - 2];
    dims[2 * i + 1] = s[r - 1];
  }
  std::vector<OutBuffer> outs;
  std::vector<void*> out_ptrs;
  outs.reserve(n.types.size());
  for (const TensorType& t : n.types) outs.emplace_back(t);
  for (OutBuffer& o : outs) out_ptrs.push_back(o.data<uint8_t>());
  auto go = [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<const T*> ins;
    for (const Tensor& t : in) ins.push_back(t.data<T>());
    linalg::run<T>(static_cast<int>(n.attrs.k), static_cast<int>(n.attrs.start), batch, dims, ins.data(), out_ptrs.data());
  };
  if (in[0].type.dtype == DType::kF64) go(std::type_identity<double>{});
  else if (in[0].type.dtype == DType::kF32) go(std::type_identity<float>{});
  else throw CompileError("Linalg of " + in[0].type.str() + ": f32 or f64 only");
  Tensors r;
  for (OutBuffer& o : outs) r.push_back(o.finish());
  return r;
}

}  // namespace chroma::interp

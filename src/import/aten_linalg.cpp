// ATen matrix products: mm, bmm, addmm, matmul, linear, baddbmm, dot.
#include <cmath>
#include <utility>

#include "import/aten.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

}  // namespace

// beta * input + alpha * prod, with PyTorch's rule that beta == 0 ignores input (NaN too).
// Integer tensors take alpha and beta converted to their type (truncated, as eager converts
// the scalars), so integer products stay integer.
Value scaled_add(Call& c, Value input, Value prod) {
  Builder& b = c.b;
  const bool integral = !is_float(b.type(prod).dtype);
  auto get = [&](size_t i, const char* name) {
    Scalar x = c.has(i, name) ? c.scalar(i, name) : Scalar::of_int(1);
    return std::pair{x, (integral && !x.is_int) ? Scalar::of_int(static_cast<int64_t>(std::trunc(x.f))) : x};
  };
  const auto [beta_given, beta] = get(3, "beta");
  const Scalar alpha = get(4, "alpha").second;
  if (alpha.as_double() != 1.0) prod = b.ew(EwOp::k_mul, prod, alpha);
  if (beta_given.as_double() == 0.0) return b.ew(EwOp::k_add, prod, b.full(Scalar::of_int(0), b.type(prod).dtype, {}));
  if (beta.as_double() != 1.0) input = b.ew(EwOp::k_mul, input, beta);
  return b.ew(EwOp::k_add, input, prod);
}

void register_aten_linalg(HandlerTable& t) {
  t["aten.mm.default"] = t["aten.bmm.default"] = t["aten.matmul.default"] = [](Call& c) {
    return one(c.b.matmul(c.tensor(0, "self"), c.tensor(1, "mat2")));
  };
  t["aten.dot.default"] = [](Call& c) { return one(c.b.matmul(c.tensor(0, "self"), c.tensor(1, "tensor"))); };
  t["aten.addmm.default"] = t["aten.baddbmm.default"] = [](Call& c) {
    Value prod = c.b.matmul(c.tensor(1, "mat1"), c.tensor(2, "mat2"));
    return one(scaled_add(c, c.tensor(0, "self"), prod));
  };
  t["aten.linear.default"] = [](Call& c) {
    Builder& b = c.b;
    Value w = c.tensor(1, "weight");
    Value y = b.matmul(c.tensor(0, "input"), b.transpose(w, -1, -2));
    if (c.is_tensor(2, "bias")) y = b.ew(EwOp::k_add, y, c.tensor(2, "bias"));
    return one(y);
  };
}

}  // namespace chroma

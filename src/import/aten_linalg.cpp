// ATen matrix products: mm, bmm, addmm, matmul, linear, baddbmm, dot.
#include "import/aten.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

// beta * input + alpha * (a @ b), with PyTorch's rule that beta == 0 ignores input (NaN too).
Value scaled_add(Call& c, Value input, Value prod) {
  const double beta = c.float_or(3, "beta", 1.0), alpha = c.float_or(4, "alpha", 1.0);
  Builder& b = c.b;
  if (alpha != 1.0) prod = b.ew(EwOp::k_mul, prod, Scalar::of_float(alpha));
  if (beta == 0.0) return prod;
  if (beta != 1.0) input = b.ew(EwOp::k_mul, input, Scalar::of_float(beta));
  return b.ew(EwOp::k_add, input, prod);
}

}  // namespace

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

// ATen matrix products: mm, bmm, addmm, matmul, linear, baddbmm, dot.
#include "import/aten.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

// beta * input + alpha * (a @ b), with PyTorch's rule that beta == 0 ignores input (NaN too).
// alpha and beta keep their kind (integers stay integers, so integer products stay integer).
Value scaled_add(Call& c, Value input, Value prod) {
  const Scalar beta = c.has(3, "beta") ? c.scalar(3, "beta") : Scalar::of_int(1);
  const Scalar alpha = c.has(4, "alpha") ? c.scalar(4, "alpha") : Scalar::of_int(1);
  Builder& b = c.b;
  if (alpha.as_double() != 1.0) prod = b.ew(EwOp::k_mul, prod, alpha);
  if (beta.as_double() == 0.0) return prod;
  if (beta.as_double() != 1.0) input = b.ew(EwOp::k_mul, input, beta);
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

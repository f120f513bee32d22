// Linalg (LAPACK) through the reference interpreter and the shape rules: small matrices with
// exactly known factorizations, batching, info, and the errors for shapes and dtypes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "chroma/cpu/linalg.h"
#include "interp/interp.h"

namespace {

using chroma::Attrs;
using chroma::CompileError;
using chroma::DType;
using chroma::Graph;
using chroma::Op;
using chroma::TensorType;
using chroma::Value;
using chroma::interp::Tensor;
namespace la = chroma::linalg;

Attrs kind(int k, int flags = 0) {
  Attrs a;
  a.k = k;
  a.start = flags;
  return a;
}

TEST(Linalg, LuPivotsAreOneBasedAndBatched) {
  Graph g;
  // Batch of two: [[1, 2], [3, 4]] (row swap) and [[4, 3], [6, 3]] (row swap).
  Tensor x = Tensor::of<double>(TensorType{DType::kF64, {2, 2, 2}}, {1, 2, 3, 4, 4, 3, 6, 3});
  Value vx = g.input("x", x.type);
  Value lu = g.add(Op::kLinalg, {vx}, kind(la::kLu));
  ASSERT_EQ(g.node(lu).types.size(), 3u);
  EXPECT_EQ(g.node(lu).type(1), (TensorType{DType::kI32, {2, 2}}));
  EXPECT_EQ(g.node(lu).type(2), (TensorType{DType::kI32, {2}}));
  g.outputs = {lu, Value{lu.node, 1}, Value{lu.node, 2}};
  std::vector<Tensor> r = chroma::interp::run(g, {x});
  std::vector<double> f = r[0].to_vector<double>();
  const std::vector<double> want = {3, 4, 1.0 / 3, 2 - 4.0 / 3, 6, 3, 4.0 / 6, 1};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(f[i], want[i], 1e-15) << i;
  EXPECT_EQ(r[1].to_vector<int32_t>(), (std::vector<int32_t>{2, 2, 2, 2}));
  EXPECT_EQ(r[2].to_vector<int32_t>(), (std::vector<int32_t>{0, 0}));
}

TEST(Linalg, CholeskyUpperAndInfo) {
  Graph g;
  // [[4, 2], [2, 3]] = U^T U with U = [[2, 1], [0, sqrt 2]]; [[1, 2], [2, 1]] is indefinite.
  Tensor x = Tensor::of<float>(TensorType{DType::kF32, {2, 2, 2}}, {4, 2, 2, 3, 1, 2, 2, 1});
  Value vx = g.input("x", x.type);
  Value c = g.add(Op::kLinalg, {vx}, kind(la::kCholesky, la::kUpper));
  g.outputs = {c, Value{c.node, 1}};
  std::vector<Tensor> r = chroma::interp::run(g, {x});
  std::vector<float> u = r[0].to_vector<float>();
  EXPECT_FLOAT_EQ(u[0], 2.0f);
  EXPECT_FLOAT_EQ(u[1], 1.0f);
  EXPECT_FLOAT_EQ(u[2], 0.0f);
  EXPECT_FLOAT_EQ(u[3], std::sqrt(2.0f));
  EXPECT_EQ(r[1].to_vector<int32_t>(), (std::vector<int32_t>{0, 2}));
}

TEST(Linalg, SvdAndEighOutputsFollowFlags) {
  Graph g;
  Value vx = g.input("x", TensorType{DType::kF32, {3, 5, 2}});
  EXPECT_EQ(g.node(g.add(Op::kLinalg, {vx}, kind(la::kSvd))).types.size(), 1u);
  Value full = g.add(Op::kLinalg, {vx}, kind(la::kSvd, la::kVectors | la::kFull));
  EXPECT_EQ(g.node(full).type(1), (TensorType{DType::kF32, {3, 5, 5}}));
  EXPECT_EQ(g.node(full).type(2), (TensorType{DType::kF32, {3, 2, 2}}));
  Value red = g.add(Op::kLinalg, {vx}, kind(la::kSvd, la::kVectors));
  EXPECT_EQ(g.node(red).type(1), (TensorType{DType::kF32, {3, 5, 2}}));
  Value vs = g.input("s", TensorType{DType::kF64, {4, 4}});
  Value e = g.add(Op::kLinalg, {vs}, kind(la::kEigh, la::kVectors));
  EXPECT_EQ(g.node(e).types.size(), 2u);
  EXPECT_EQ(g.node(e).type(0), (TensorType{DType::kF64, {4}}));
}

TEST(Linalg, ExpmOfNilpotentAndRotation) {
  Graph g;
  // exp([[0, 1], [0, 0]]) = [[1, 1], [0, 1]]; exp([[0, -8], [8, 0]]) = rotation by 8 rad
  // (norm 8 > theta13: two squarings).
  Tensor x = Tensor::of<double>(TensorType{DType::kF64, {2, 2, 2}}, {0, 1, 0, 0, 0, -8, 8, 0});
  Value vx = g.input("x", x.type);
  g.outputs = {g.add(Op::kLinalg, {vx}, kind(la::kExpm))};
  std::vector<double> e = chroma::interp::run(g, {x})[0].to_vector<double>();
  const std::vector<double> want = {1, 1, 0, 1, std::cos(8.0), -std::sin(8.0), std::sin(8.0), std::cos(8.0)};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(e[i], want[i], 1e-13) << i;
}

TEST(Linalg, ShapeAndDtypeErrors) {
  Graph g;
  Value rect = g.input("r", TensorType{DType::kF32, {3, 2}});
  Value ints = g.input("i", TensorType{DType::kI64, {2, 2}});
  Value sq = g.input("s", TensorType{DType::kF32, {2, 2}});
  Value other = g.input("o", TensorType{DType::kF64, {2, 2}});
  EXPECT_THROW(g.add(Op::kLinalg, {rect}, kind(la::kCholesky)), CompileError);
  EXPECT_THROW(g.add(Op::kLinalg, {ints}, kind(la::kLu)), CompileError);
  EXPECT_THROW(g.add(Op::kLinalg, {sq, other}, kind(la::kTriSolve, la::kLeft)), CompileError);
  EXPECT_THROW(g.add(Op::kLinalg, {sq, rect}, kind(la::kTriSolve, la::kLeft)), CompileError);
  EXPECT_THROW(g.add(Op::kLinalg, {sq}, kind(la::kKindCount)), CompileError);
  EXPECT_THROW(g.add(Op::kLinalg, {sq, sq}, kind(la::kEigh)), CompileError);
}

}  // namespace

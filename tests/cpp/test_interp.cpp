// Tests for the reference interpreter (src/interp/): small graphs built with Graph::add and
// the convenience builders, run through interp::run, compared with exact expected values.
#include "interp/interp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace {

using chroma::Attrs;
using chroma::CompileError;
using chroma::ConstantData;
using chroma::DType;
using chroma::EwOp;
using chroma::Graph;
using chroma::Op;
using chroma::ReduceKind;
using chroma::Scalar;
using chroma::Shape;
using chroma::TensorType;
using chroma::Value;
using chroma::interp::Tensor;

template <class T> Tensor tensor(DType dt, Shape shape, std::vector<T> values) {
  return Tensor::of<T>(TensorType{dt, std::move(shape)}, values);
}
Tensor f32(Shape shape, std::vector<float> v) { return tensor<float>(DType::kF32, std::move(shape), std::move(v)); }
Tensor i64(Shape shape, std::vector<int64_t> v) { return tensor<int64_t>(DType::kI64, std::move(shape), std::move(v)); }
Tensor boolean(Shape shape, std::vector<bool> v) {
  std::vector<uint8_t> b(v.begin(), v.end());
  return tensor<uint8_t>(DType::kBool, std::move(shape), b);
}
std::vector<bool> bools(const Tensor& t) {
  std::vector<bool> out;
  for (uint8_t b : t.to_vector<uint8_t>()) out.push_back(b != 0);
  return out;
}

// Runs a graph with one output and returns it.
Tensor run1(Graph& g, Value out, const std::vector<Tensor>& inputs) {
  g.outputs = {out};
  std::vector<Tensor> r = chroma::interp::run(g, inputs);
  EXPECT_EQ(r.size(), 1u);
  return r.at(0);
}

// Applies a Map of `op` to inputs of the given tensors.
Tensor map(EwOp op, const std::vector<Tensor>& args) {
  Graph g;
  std::vector<Value> vs;
  for (size_t i = 0; i < args.size(); ++i) vs.push_back(g.input("x" + std::to_string(i), args[i].type));
  return run1(g, g.map(op, vs), args);
}

// Applies a single-input op with attributes to `x`.
Tensor unary(Op op, const Tensor& x, Attrs a) {
  Graph g;
  Value v = g.input("x", x.type);
  return run1(g, g.add(op, {v}, a), {x});
}

// ---------------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------------

TEST(InterpMap, FloatArithmetic) {
  Tensor a = f32({4}, {1.5f, -2.0f, 0.0f, 9.0f});
  Tensor b = f32({4}, {0.5f, 4.0f, 2.0f, -3.0f});
  EXPECT_EQ(map(EwOp::k_add, {a, b}).to_vector<float>(), (std::vector<float>{2.0f, 2.0f, 2.0f, 6.0f}));
  EXPECT_EQ(map(EwOp::k_sub, {a, b}).to_vector<float>(), (std::vector<float>{1.0f, -6.0f, -2.0f, 12.0f}));
  EXPECT_EQ(map(EwOp::k_mul, {a, b}).to_vector<float>(), (std::vector<float>{0.75f, -8.0f, 0.0f, -27.0f}));
  EXPECT_EQ(map(EwOp::k_div, {a, b}).to_vector<float>(), (std::vector<float>{3.0f, -0.5f, 0.0f, -3.0f}));
  EXPECT_EQ(map(EwOp::k_neg, {a}).to_vector<float>(), (std::vector<float>{-1.5f, 2.0f, -0.0f, -9.0f}));
  EXPECT_EQ(map(EwOp::k_relu, {a}).to_vector<float>(), (std::vector<float>{1.5f, 0.0f, 0.0f, 9.0f}));
  EXPECT_EQ(map(EwOp::k_sqrt, {f32({2}, {4.0f, 9.0f})}).to_vector<float>(), (std::vector<float>{2.0f, 3.0f}));
  EXPECT_EQ(map(EwOp::k_exp, {f32({1}, {0.0f})}).to_vector<float>(), (std::vector<float>{1.0f}));
  // torch.round: half to even.
  EXPECT_EQ(map(EwOp::k_round, {f32({4}, {0.5f, 1.5f, 2.5f, -0.5f})}).to_vector<float>(),
            (std::vector<float>{0.0f, 2.0f, 2.0f, -0.0f}));
}

TEST(InterpMap, NanPropagatesThroughMaximum) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor r = map(EwOp::k_maximum, {f32({2}, {nan, 1.0f}), f32({2}, {0.0f, 2.0f})});
  std::vector<float> v = r.to_vector<float>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], 2.0f);
}

TEST(InterpMap, Int64FloorDivideAndRemainderFollowPython) {
  Tensor a = i64({6}, {7, -7, 7, -7, 6, -6});
  Tensor b = i64({6}, {2, 2, -2, -2, 3, 4});
  EXPECT_EQ(map(EwOp::k_floor_divide, {a, b}).to_vector<int64_t>(), (std::vector<int64_t>{3, -4, -4, 3, 2, -2}));
  EXPECT_EQ(map(EwOp::k_remainder, {a, b}).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, -1, -1, 0, 2}));
  // fmod truncates like C.
  EXPECT_EQ(map(EwOp::k_fmod, {a, b}).to_vector<int64_t>(), (std::vector<int64_t>{1, -1, 1, -1, 0, -2}));
}

TEST(InterpMap, IntegerDivisionEdgeCases) {
  const int64_t lo = std::numeric_limits<int64_t>::min();
  Tensor a = i64({2}, {lo, 5});
  Tensor b = i64({2}, {-1, -1});
  EXPECT_EQ(map(EwOp::k_floor_divide, {a, b}).to_vector<int64_t>(), (std::vector<int64_t>{lo, -5}));
  EXPECT_EQ(map(EwOp::k_remainder, {a, b}).to_vector<int64_t>(), (std::vector<int64_t>{0, 0}));
  EXPECT_THROW(map(EwOp::k_floor_divide, {i64({1}, {3}), i64({1}, {0})}), CompileError);
  EXPECT_THROW(map(EwOp::k_remainder, {i64({1}, {3}), i64({1}, {0})}), CompileError);
}

TEST(InterpMap, FloatRemainderFollowsPython) {
  Tensor r = map(EwOp::k_remainder, {f32({2}, {-7.0f, 7.0f}), f32({2}, {2.0f, -2.0f})});
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{1.0f, -1.0f}));
}

TEST(InterpMap, IntegerPowAndAbs) {
  EXPECT_EQ(map(EwOp::k_pow, {i64({4}, {2, 3, -2, 2}), i64({4}, {10, 0, 3, -1})}).to_vector<int64_t>(),
            (std::vector<int64_t>{1024, 1, -8, 0}));
  EXPECT_EQ(map(EwOp::k_abs, {i64({2}, {-4, 4})}).to_vector<int64_t>(), (std::vector<int64_t>{4, 4}));
}

TEST(InterpMap, BoolLogicalOps) {
  Tensor a = boolean({4}, {false, false, true, true});
  Tensor b = boolean({4}, {false, true, false, true});
  EXPECT_EQ(bools(map(EwOp::k_logical_and, {a, b})), (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(bools(map(EwOp::k_logical_or, {a, b})), (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(bools(map(EwOp::k_logical_xor, {a, b})), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(bools(map(EwOp::k_logical_not, {a})), (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(bools(map(EwOp::k_bitwise_not, {a})), (std::vector<bool>{true, true, false, false}));
  // bool add is logical or.
  EXPECT_EQ(bools(map(EwOp::k_add, {a, b})), (std::vector<bool>{false, true, true, true}));
  // logical ops on non-bool operands test truthiness and produce bool.
  Tensor r = map(EwOp::k_logical_and, {f32({3}, {0.0f, 2.0f, -1.0f}), f32({3}, {1.0f, 0.5f, 0.0f})});
  EXPECT_EQ(r.type.dtype, DType::kBool);
  EXPECT_EQ(bools(r), (std::vector<bool>{false, true, false}));
}

TEST(InterpMap, ComparisonsProduceBool) {
  Tensor r = map(EwOp::k_lt, {i64({3}, {1, 2, 3}), i64({3}, {2, 2, 2})});
  EXPECT_EQ(r.type.dtype, DType::kBool);
  EXPECT_EQ(bools(r), (std::vector<bool>{true, false, false}));
}

TEST(InterpMap, Where) {
  Tensor c = boolean({3}, {true, false, true});
  Tensor r = map(EwOp::k_where, {c, i64({3}, {1, 2, 3}), i64({3}, {10, 20, 30})});
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{1, 20, 3}));
}

TEST(InterpMap, Int8WrapsAndBitwise) {
  Tensor a = tensor<int8_t>(DType::kI8, {2}, {127, 12});
  Tensor b = tensor<int8_t>(DType::kI8, {2}, {1, 10});
  EXPECT_EQ(map(EwOp::k_add, {a, b}).to_vector<int8_t>(), (std::vector<int8_t>{-128, 22}));
  EXPECT_EQ(map(EwOp::k_bitwise_and, {a, b}).to_vector<int8_t>(), (std::vector<int8_t>{1, 8}));
  EXPECT_EQ(map(EwOp::k_bitwise_xor, {a, b}).to_vector<int8_t>(), (std::vector<int8_t>{126, 6}));
}

TEST(InterpCast, ConvertsLikeC) {
  Graph g;
  Tensor x = f32({5}, {2.7f, -2.7f, 0.0f, 0.5f, -300.0f});
  Value v = g.input("x", x.type);
  g.outputs = {g.cast(v, DType::kI64), g.cast(v, DType::kBool), g.cast(v, DType::kF64), g.cast(v, DType::kU8)};
  std::vector<Tensor> r = chroma::interp::run(g, {x});
  EXPECT_EQ(r[0].to_vector<int64_t>(), (std::vector<int64_t>{2, -2, 0, 0, -300}));
  EXPECT_EQ(bools(r[1]), (std::vector<bool>{true, true, false, true, true}));
  EXPECT_EQ(r[2].to_vector<double>(), (std::vector<double>{2.7f, -2.7f, 0.0, 0.5, -300.0}));
  // -300 -> int32 -300 -> low byte 212.
  EXPECT_EQ(r[3].to_vector<uint8_t>(), (std::vector<uint8_t>{2, 254, 0, 0, 212}));
}

TEST(InterpFull, FillsConvertedScalar) {
  Graph g;
  g.outputs = {g.full(Scalar::of_float(2.5), TensorType{DType::kF32, {2, 2}}),
               g.full(Scalar::of_float(2.5), TensorType{DType::kI32, {3}}),
               g.full(Scalar::of_int(-1), TensorType{DType::kBool, {1}})};
  std::vector<Tensor> r = chroma::interp::run(g, {});
  EXPECT_EQ(r[0].to_vector<float>(), (std::vector<float>{2.5f, 2.5f, 2.5f, 2.5f}));
  EXPECT_EQ(r[1].to_vector<int32_t>(), (std::vector<int32_t>{2, 2, 2}));
  EXPECT_EQ(bools(r[2]), (std::vector<bool>{true}));
}

TEST(InterpIota, AffineInEachIndex) {
  Graph g;
  Attrs a;
  a.dtype = DType::kI64;
  a.ints = {2, 3};
  a.coeffs = {10.0, 2.0};
  a.scalar = Scalar::of_int(5);
  Tensor r = run1(g, g.add(Op::kIota, {}, a), {});
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{5, 7, 9, 15, 17, 19}));

  Graph h;
  Attrs b;
  b.dtype = DType::kF32;
  b.ints = {4};
  b.coeffs = {0.5};
  b.scalar = Scalar::of_float(-1.0);
  EXPECT_EQ(run1(h, h.add(Op::kIota, {}, b), {}).to_vector<float>(), (std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f}));
}

// ---------------------------------------------------------------------------------------------
// Views and data movement
// ---------------------------------------------------------------------------------------------

TEST(InterpExpand, BroadcastsThenAdds) {
  // [2,1] + [1,3] via explicit Expand to [2,3].
  Graph g;
  Tensor a = f32({2, 1}, {1.0f, 2.0f});
  Tensor b = f32({1, 3}, {10.0f, 20.0f, 30.0f});
  Value va = g.input("a", a.type);
  Value vb = g.input("b", b.type);
  Attrs e;
  e.ints = {2, 3};
  Value ea = g.add(Op::kExpand, {va}, e);
  Value eb = g.add(Op::kExpand, {vb}, e);
  Tensor r = run1(g, g.map(EwOp::k_add, {ea, eb}), {a, b});
  EXPECT_EQ(r.type.shape, (Shape{2, 3}));
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{11.0f, 21.0f, 31.0f, 12.0f, 22.0f, 32.0f}));
}

TEST(InterpPermute, ThreeDimensional) {
  // x[i,j,k] = 100i + 10j + k, shape [2,3,4]; permute (2,0,1) -> y[k,i,j] = x[i,j,k].
  std::vector<int64_t> vals;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) vals.push_back(100 * i + 10 * j + k);
  Attrs a;
  a.ints = {2, 0, 1};
  Tensor r = unary(Op::kPermute, i64({2, 3, 4}, vals), a);
  EXPECT_EQ(r.type.shape, (Shape{4, 2, 3}));
  std::vector<int64_t> v = r.to_vector<int64_t>();
  for (int64_t k = 0; k < 4; ++k)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(v[static_cast<size_t>((k * 2 + i) * 3 + j)], 100 * i + 10 * j + k);
}

TEST(InterpSlice, WithStep) {
  std::vector<int64_t> vals(20);
  std::iota(vals.begin(), vals.end(), 0);
  Attrs a;
  a.axis = 1;
  a.start = 1;
  a.end = 10;
  a.step = 3;
  Tensor r = unary(Op::kSlice, i64({2, 10}, vals), a);
  EXPECT_EQ(r.type.shape, (Shape{2, 3}));
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 7, 11, 14, 17}));
}

TEST(InterpReshape, KeepsOrderAndSharesBytes) {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Attrs a;
  a.ints = {3, 1, 2};
  Tensor r = unary(Op::kReshape, x, a);
  EXPECT_EQ(r.type.shape, (Shape{3, 1, 2}));
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(r.bytes.get(), x.bytes.get());
}

TEST(InterpConcat, MiddleAxis) {
  Graph g;
  Tensor a = i64({2, 1, 2}, {1, 2, 3, 4});
  Tensor b = i64({2, 2, 2}, {10, 20, 30, 40, 50, 60, 70, 80});
  Value va = g.input("a", a.type);
  Value vb = g.input("b", b.type);
  Attrs c;
  c.axis = 1;
  Tensor r = run1(g, g.add(Op::kConcat, {va, vb}, c), {a, b});
  EXPECT_EQ(r.type.shape, (Shape{2, 3, 2}));
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 10, 20, 30, 40, 3, 4, 50, 60, 70, 80}));
}

TEST(InterpGather, IndexSelect) {
  Graph g;
  Tensor src = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor idx = i64({2, 2}, {2, 0, 1, 1});
  Value vs = g.input("src", src.type);
  Value vi = g.input("idx", idx.type);
  Attrs a;
  a.axis = 1;
  Tensor r = run1(g, g.add(Op::kGather, {vs, vi}, a), {src, idx});
  EXPECT_EQ(r.type.shape, (Shape{2, 2, 2}));
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{3, 1, 2, 2, 6, 4, 5, 5}));
}

TEST(InterpGather, OutOfRangeThrows) {
  for (int64_t bad : {int64_t{-1}, int64_t{5}}) {
    Graph g;
    Tensor src = f32({5}, {1, 2, 3, 4, 5});
    Tensor idx = i64({2}, {0, bad});
    Value vs = g.input("src", src.type);
    Value vi = g.input("idx", idx.type);
    g.outputs = {g.add(Op::kGather, {vs, vi}, Attrs{})};
    try {
      chroma::interp::run(g, {src, idx});
      FAIL() << "expected CompileError";
    } catch (const CompileError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("index " + std::to_string(bad) + " is out of range for dimension 0 of size 5"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("Gather %2"), std::string::npos) << msg;
    }
  }
}

TEST(InterpGatherElements, TorchGather) {
  Graph g;
  Tensor src = i64({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor idx = i64({2, 2}, {2, 0, 1, 1});
  Value vs = g.input("src", src.type);
  Value vi = g.input("idx", idx.type);
  Attrs a;
  a.axis = 1;
  Tensor r = run1(g, g.add(Op::kGatherElements, {vs, vi}, a), {src, idx});
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{3, 1, 5, 5}));

  Graph h;
  Value hs = h.input("src", src.type);
  Value hi = h.input("idx", TensorType{DType::kI64, {1, 3}});
  Attrs b;
  b.axis = 0;
  Tensor r0 = run1(h, h.add(Op::kGatherElements, {hs, hi}, b), {src, i64({1, 3}, {1, 0, 1})});
  EXPECT_EQ(r0.to_vector<int64_t>(), (std::vector<int64_t>{4, 2, 6}));
  EXPECT_THROW(chroma::interp::run(h, {src, i64({1, 3}, {0, 2, 0})}), CompileError);
}

// ---------------------------------------------------------------------------------------------
// Reductions, MatMul, TopK
// ---------------------------------------------------------------------------------------------

TEST(InterpReduce, SumOverTwoAxesKeepdim) {
  // x[i,j,k] = 100i + 10j + k, shape [2,3,4]; sum over axes {0,2} keepdim -> [1,3,1].
  std::vector<float> vals;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) vals.push_back(static_cast<float>(100 * i + 10 * j + k));
  Attrs a;
  a.reduce = ReduceKind::kSum;
  a.ints = {0, 2};
  a.keepdim = true;
  Tensor r = unary(Op::kReduce, f32({2, 3, 4}, vals), a);
  EXPECT_EQ(r.type.shape, (Shape{1, 3, 1}));
  // sum over i,k of 100i + 10j + k = 400 + 80j + 12.
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{412.0f, 492.0f, 572.0f}));
}

TEST(InterpReduce, ProdMaxMin) {
  Tensor x = i64({2, 3}, {1, -2, 3, 4, 5, -6});
  Attrs a;
  a.ints = {1};
  a.reduce = ReduceKind::kProd;
  EXPECT_EQ(unary(Op::kReduce, x, a).to_vector<int64_t>(), (std::vector<int64_t>{-6, -120}));
  a.reduce = ReduceKind::kMax;
  EXPECT_EQ(unary(Op::kReduce, x, a).to_vector<int64_t>(), (std::vector<int64_t>{3, 5}));
  a.ints = {0};
  a.reduce = ReduceKind::kMin;
  EXPECT_EQ(unary(Op::kReduce, x, a).to_vector<int64_t>(), (std::vector<int64_t>{1, -2, -6}));
}

TEST(InterpReduce, MaxPropagatesNanAndBoolAnyAll) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Attrs a;
  a.ints = {1};
  a.reduce = ReduceKind::kMax;
  std::vector<float> v = unary(Op::kReduce, f32({2, 2}, {1.0f, nan, 3.0f, 2.0f}), a).to_vector<float>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], 3.0f);

  Tensor b = boolean({2, 2}, {false, true, false, false});
  EXPECT_EQ(bools(unary(Op::kReduce, b, a)), (std::vector<bool>{true, false}));
  a.reduce = ReduceKind::kMin;
  EXPECT_EQ(bools(unary(Op::kReduce, boolean({2, 2}, {true, true, false, true}), a)), (std::vector<bool>{true, false}));
}

TEST(InterpReduce, EmptySets) {
  Tensor x = f32({2, 0}, {});
  Attrs a;
  a.ints = {1};
  a.reduce = ReduceKind::kSum;
  EXPECT_EQ(unary(Op::kReduce, x, a).to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
  a.reduce = ReduceKind::kProd;
  EXPECT_EQ(unary(Op::kReduce, x, a).to_vector<float>(), (std::vector<float>{1.0f, 1.0f}));
  a.reduce = ReduceKind::kMax;
  EXPECT_THROW(unary(Op::kReduce, x, a), CompileError);
}

TEST(InterpArgReduce, FirstExtremeAndNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Attrs a;
  a.axis = 1;
  a.reduce = ReduceKind::kMax;
  Tensor x = f32({3, 4}, {1, 5, 5, 2, 0, nan, 9, nan, -1, -3, -3, 0});
  EXPECT_EQ(unary(Op::kArgReduce, x, a).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 3}));
  a.reduce = ReduceKind::kMin;
  EXPECT_EQ(unary(Op::kArgReduce, x, a).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1}));
  a.axis = 0;
  a.keepdim = true;
  Tensor r = unary(Op::kArgReduce, x, a);
  EXPECT_EQ(r.type.shape, (Shape{1, 4}));
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{2, 1, 2, 1}));
}

TEST(InterpMatMul, Batched) {
  Graph g;
  // batch 2 of [2,3] x [3,2].
  Tensor x = f32({2, 2, 3}, {1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0});
  Tensor y = f32({2, 3, 2}, {1, 0, 0, 1, 1, 1, 7, 8, 9, 10, 11, 12});
  Value vx = g.input("x", x.type);
  Value vy = g.input("y", y.type);
  Tensor r = run1(g, g.add(Op::kMatMul, {vx, vy}), {x, y});
  EXPECT_EQ(r.type.shape, (Shape{2, 2, 2}));
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{4, 5, 10, 11, 7, 8, 9, 10}));
}

TEST(InterpMatMul, Int64) {
  Graph g;
  Tensor x = i64({1, 2}, {3, -4});
  Tensor y = i64({2, 3}, {1, 2, 3, 4, 5, 6});
  Value vx = g.input("x", x.type);
  Value vy = g.input("y", y.type);
  EXPECT_EQ(run1(g, g.add(Op::kMatMul, {vx, vy}), {x, y}).to_vector<int64_t>(), (std::vector<int64_t>{-13, -14, -15}));
}

TEST(InterpTopK, OrderTiesAndNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Graph g;
  Tensor x = f32({2, 5}, {3, 1, 3, nan, 2, 5, 4, 4, 1, 0});
  Value vx = g.input("x", x.type);
  Attrs a;
  a.axis = 1;
  a.k = 3;
  a.largest = true;
  Value t = g.add(Op::kTopK, {vx}, a);
  g.outputs = {t, Value{t.node, 1}};
  std::vector<Tensor> r = chroma::interp::run(g, {x});
  std::vector<float> v = r[0].to_vector<float>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(std::vector<float>(v.begin() + 1, v.end()), (std::vector<float>{3, 3, 5, 4, 4}));
  EXPECT_EQ(r[1].to_vector<int64_t>(), (std::vector<int64_t>{3, 0, 2, 0, 1, 2}));

  // Smallest along axis 0 of a [3,2] tensor: NaN counts as largest, so it comes last.
  Graph h;
  Tensor y = f32({3, 2}, {2, nan, 1, 7, 2, 7});
  Value vy = h.input("y", y.type);
  Attrs b;
  b.axis = 0;
  b.k = 3;
  b.largest = false;
  Value s = h.add(Op::kTopK, {vy}, b);
  h.outputs = {s, Value{s.node, 1}};
  std::vector<Tensor> q = chroma::interp::run(h, {y});
  std::vector<float> qv = q[0].to_vector<float>();
  EXPECT_EQ(qv[0], 1.0f);
  EXPECT_EQ(qv[1], 7.0f);
  EXPECT_EQ(qv[2], 2.0f);
  EXPECT_EQ(qv[3], 7.0f);
  EXPECT_EQ(qv[4], 2.0f);
  EXPECT_TRUE(std::isnan(qv[5]));
  EXPECT_EQ(q[1].to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0, 2, 2, 0}));
}

TEST(InterpScan, SumProdMaxMinAlongEitherAxis) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = f32({2, 4}, {1, -2, 3, 0.5f, 2, nan, 1, 5});
  auto scan = [&](ReduceKind k, int64_t axis, bool log = false) {
    Graph g;
    Value vx = g.input("x", x.type);
    Attrs a;
    a.axis = axis;
    a.reduce = k;
    a.log = log;
    return run1(g, g.add(Op::kScan, {vx}, a), {x}).to_vector<float>();
  };
  EXPECT_EQ(scan(ReduceKind::kSum, 0)[4], 3.0f);
  std::vector<float> s = scan(ReduceKind::kSum, 1);
  EXPECT_EQ(std::vector<float>(s.begin(), s.begin() + 4), (std::vector<float>{1, -1, 2, 2.5f}));
  EXPECT_EQ(s[4], 2.0f);
  EXPECT_TRUE(std::isnan(s[5]) && std::isnan(s[7]));
  std::vector<float> p = scan(ReduceKind::kProd, 1);
  EXPECT_EQ(std::vector<float>(p.begin(), p.begin() + 4), (std::vector<float>{1, -2, -6, -3}));
  std::vector<float> mx = scan(ReduceKind::kMax, 1);
  EXPECT_EQ(std::vector<float>(mx.begin(), mx.begin() + 5), (std::vector<float>{1, 1, 3, 3, 2}));
  EXPECT_TRUE(std::isnan(mx[5]) && std::isnan(mx[6]) && std::isnan(mx[7]));  // NaN propagates
  std::vector<float> mn = scan(ReduceKind::kMin, 1);
  EXPECT_EQ(std::vector<float>(mn.begin(), mn.begin() + 4), (std::vector<float>{1, -2, -2, -2}));
  std::vector<float> l = scan(ReduceKind::kSum, 1, true);
  EXPECT_FLOAT_EQ(l[1], static_cast<float>(std::log(std::exp(1.0) + std::exp(-2.0))));
  EXPECT_FLOAT_EQ(l[3], static_cast<float>(std::log(std::exp(1.0) + std::exp(-2.0) + std::exp(3.0) + std::exp(0.5))));
}

TEST(InterpScan, IntegerSumIsExactAndWraps) {
  Graph g;
  const int64_t big = std::numeric_limits<int64_t>::max();
  Tensor x = i64({4}, {big, 1, 3, -5});
  Value vx = g.input("x", x.type);
  Attrs a;
  a.axis = 0;
  EXPECT_EQ(run1(g, g.add(Op::kScan, {vx}, a), {x}).to_vector<int64_t>(),
            (std::vector<int64_t>{big, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::min() + 3,
                                  big - 1}));
}

TEST(InterpScan, LogNeedsFloatSum) {
  Graph g;
  Value vx = g.input("x", TensorType{DType::kI64, {3}});
  Attrs a;
  a.log = true;
  EXPECT_THROW(g.add(Op::kScan, {vx}, a), CompileError);
}

TEST(InterpIndexPut, CombinesDuplicatesWithEachReduction) {
  Tensor base = f32({3}, {1, 2, 3});
  Tensor idx = i64({4}, {0, 2, 0, 2});
  Tensor val = f32({4}, {5, -1, 4, 7});
  auto put = [&](bool acc, ReduceKind k) {
    Graph g;
    Value vb = g.input("b", base.type), vi = g.input("i", idx.type), vv = g.input("v", val.type);
    Attrs a;
    a.accumulate = acc;
    a.reduce = k;
    return run1(g, g.add(Op::kIndexPut, {vb, vi, vv}, a), {base, idx, val}).to_vector<float>();
  };
  EXPECT_EQ(put(false, ReduceKind::kSum), (std::vector<float>{4, 2, 7}));  // last write wins
  EXPECT_EQ(put(true, ReduceKind::kSum), (std::vector<float>{10, 2, 9}));
  EXPECT_EQ(put(true, ReduceKind::kProd), (std::vector<float>{20, 2, -21}));
  EXPECT_EQ(put(true, ReduceKind::kMax), (std::vector<float>{5, 2, 7}));
  EXPECT_EQ(put(true, ReduceKind::kMin), (std::vector<float>{1, 2, -1}));
}

TEST(IrText, ScanAndCombiningIndexPutRoundTrip) {
  Graph g;
  Value vx = g.input("x", TensorType{DType::kF32, {2, 3}});
  Value vi = g.input("i", TensorType{DType::kI64, {2}});
  Attrs s;
  s.axis = 1;
  s.reduce = ReduceKind::kMax;
  Value sc = g.add(Op::kScan, {vx}, s);
  Attrs l;
  l.axis = 0;
  l.log = true;
  Value ls = g.add(Op::kScan, {sc}, l);
  Attrs p;
  p.axis = 0;
  p.accumulate = true;
  p.reduce = ReduceKind::kMin;
  Value out = g.add(Op::kIndexPut, {ls, vi, sc}, p);
  g.outputs = {out};
  const std::string text = chroma::print(g);
  EXPECT_NE(text.find("Scan.max(%0) {axis=1}"), std::string::npos) << text;
  EXPECT_NE(text.find("Scan.sum(%2) {axis=0, log}"), std::string::npos) << text;
  EXPECT_NE(text.find("accumulate=min"), std::string::npos) << text;
  Graph back = chroma::parse(text);
  EXPECT_EQ(chroma::print(back), text);
  EXPECT_EQ(back.node(back.outputs[0]).attrs.reduce, ReduceKind::kMin);
}

// ---------------------------------------------------------------------------------------------
// Whole graphs and eval_node
// ---------------------------------------------------------------------------------------------

TEST(InterpRun, ConstantsAndChains) {
  Graph g;
  std::vector<uint8_t> raw(3 * sizeof(float));
  const float w[3] = {1.0f, 2.0f, 3.0f};
  std::memcpy(raw.data(), w, sizeof w);
  const chroma::BlobPtr bytes = chroma::make_blob(std::move(raw));
  Value c = g.constant(ConstantData{TensorType{DType::kF32, {3}}, "w", bytes});
  Tensor x = f32({3}, {10, 20, 30});
  Value vx = g.input("x", x.type);
  Value m = g.map(EwOp::k_mul, {vx, c});
  Attrs r;
  r.ints = {0};
  Value s = g.add(Op::kReduce, {m}, r);
  g.outputs = {s, m};
  std::vector<Tensor> out = chroma::interp::run(g, {x});
  EXPECT_EQ(out[0].type.shape, (Shape{}));
  EXPECT_EQ(out[0].to_vector<float>(), (std::vector<float>{140.0f}));
  EXPECT_EQ(out[1].to_vector<float>(), (std::vector<float>{10, 40, 90}));
  // eval_node on the constant shares its bytes.
  std::vector<Tensor> cv = chroma::interp::eval_node(g, c.node, {});
  EXPECT_EQ(cv[0].bytes.get(), bytes.get());
}

TEST(InterpRun, RejectsMistypedInputs) {
  Graph g;
  Value vx = g.input("x", TensorType{DType::kF32, {3}});
  g.outputs = {g.map(EwOp::k_neg, {vx})};
  EXPECT_THROW(chroma::interp::run(g, {i64({3}, {1, 2, 3})}), CompileError);
  EXPECT_THROW(chroma::interp::run(g, {}), CompileError);
  EXPECT_THROW(chroma::interp::eval_node(g, 1, {f32({2}, {1, 2})}), CompileError);
  EXPECT_THROW(chroma::interp::eval_node(g, 0, {}), CompileError);
}

TEST(InterpRun, LargeElementwiseChain) {
  // A million-element fold should be quick: iota -> mul -> sum.
  Graph g;
  Attrs a;
  a.dtype = DType::kF64;
  a.ints = {1000, 1000};
  a.coeffs = {1000.0, 1.0};
  a.scalar = Scalar::of_int(0);
  Value io = g.add(Op::kIota, {}, a);
  Value sq = g.map(EwOp::k_mul, {io, io});
  Attrs p;
  p.ints = {1, 0};
  Value t = g.add(Op::kPermute, {sq}, p);
  Attrs r;
  r.ints = {0, 1};
  Value s = g.add(Op::kReduce, {t}, r);
  Tensor out = run1(g, s, {});
  // sum_{n<N} n^2 = (N-1)N(2N-1)/6 ~ 3.3e17: equal up to double rounding.
  const double n = 1e6;
  const double expected = (n - 1) * n * (2 * n - 1) / 6;
  EXPECT_NEAR(out.to_vector<double>()[0], expected, expected * 1e-9);
}

}  // namespace

// Lowering: the fusion rule (src/lower/README.md, "Fusion"), views as layouts, the memory plan.
#include <gtest/gtest.h>

#include "lower/layout.h"
#include "lower/program.h"

namespace chroma {
namespace {

TensorType f32(Shape s) { return TensorType{DType::kF32, std::move(s)}; }

Value reshape(Graph& g, Value v, Shape s) {
  Attrs a;
  a.ints = std::move(s);
  return g.add(Op::kReshape, {v}, a);
}

Value permute(Graph& g, Value v, std::vector<int64_t> p) {
  Attrs a;
  a.ints = std::move(p);
  return g.add(Op::kPermute, {v}, a);
}

Value sum_last(Graph& g, Value v) {
  Attrs a;
  a.reduce = ReduceKind::kSum;
  a.ints = {g.type(v).rank() - 1};
  return g.add(Op::kReduce, {v}, a);
}

int count_kind(const Program& p, Kernel::Kind k) {
  int n = 0;
  for (const Kernel& kr : p.kernels) n += kr.kind == k;
  return n;
}

TEST(Lower, ChainFusesIntoTheReduction) {
  Graph g;
  Value x = g.input("x", f32({4, 7}));
  Value one = g.full(Scalar::of_float(1.0), f32({4, 7}));
  Value s = g.map(EwOp::k_sin, {g.map(EwOp::k_add, {x, one})});
  g.outputs = {sum_last(g, s)};
  Program p = lower(g);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].kind, Kernel::kReduce);
  EXPECT_EQ(p.arena_bytes, 0);
  EXPECT_EQ(p.fused_expressions, 2);
}

TEST(Lower, ValueReadTwiceIsMaterializedOnce) {
  Graph g;
  Value x = g.input("x", f32({4, 7}));
  Value e = g.map(EwOp::k_exp, {x});
  Value a = sum_last(g, e);
  Attrs mx;
  mx.reduce = ReduceKind::kMax;
  mx.ints = {1};
  Value b = g.add(Op::kReduce, {e}, mx);
  g.outputs = {g.map(EwOp::k_add, {a, b})};
  Program p = lower(g);
  EXPECT_EQ(count_kind(p, Kernel::kAssign), 2);  // exp, and the output add
  EXPECT_EQ(count_kind(p, Kernel::kReduce), 2);
  EXPECT_EQ(p.kernels[0].label, "Map.exp");
}

TEST(Lower, ViewsAreTransparentForTheReadCount) {
  // exp(x) read once through a transpose: stays fused, the transpose is a layout.
  Graph g;
  Value x = g.input("x", f32({3, 5}));
  Value t = permute(g, g.map(EwOp::k_exp, {x}), {1, 0});
  g.outputs = {sum_last(g, t)};
  Program p = lower(g);
  ASSERT_EQ(p.kernels.size(), 1u);
  const Expr& e = p.kernels[0].inputs[0];
  ASSERT_EQ(e.kind, Expr::kMap);
  ASSERT_EQ(e.children[0].kind, Expr::kLoad);
  EXPECT_EQ(e.children[0].layout.strides, (std::vector<int64_t>{1, 5}));
}

TEST(Lower, DeepChainsAreCutAtTheDepthLimit) {
  Graph g;
  Value v = g.input("x", f32({8}));
  for (int i = 0; i < 70; ++i) v = g.map(EwOp::k_neg, {v});
  g.outputs = {v};
  LowerOptions o;
  o.max_expression_depth = 32;
  Program p = lower(g, o);
  EXPECT_EQ(p.kernels.size(), 3u);  // 32 + 32 + 6 levels
  for (const Kernel& k : p.kernels) EXPECT_LE(k.inputs[0].depth(), 32);
}

TEST(Lower, ReshapeOfATransposedBufferCopies) {
  Graph g;
  Value x = g.input("x", f32({3, 4}));
  Value r = reshape(g, permute(g, x, {1, 0}), {12});
  g.outputs = {g.map(EwOp::k_neg, {r})};
  Program p = lower(g);
  ASSERT_EQ(p.kernels.size(), 2u);  // the transposed copy, then neg over the flat view
  EXPECT_EQ(p.kernels[0].kind, Kernel::kAssign);
  EXPECT_EQ(p.kernels[1].inputs[0].children[0].layout.strides, (std::vector<int64_t>{1}));
}

TEST(Lower, MatMulReadsTransposedWeightsInPlace) {
  Graph g;
  Value x = g.input("x", f32({2, 3}));
  Value w = g.input("w", f32({4, 3}));
  g.outputs = {g.add(Op::kMatMul, {x, permute(g, w, {1, 0})})};
  Program p = lower(g);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].kind, Kernel::kMatMul);
  EXPECT_EQ(p.kernels[0].inputs[1].layout.strides, (std::vector<int64_t>{1, 3}));
}

TEST(Lower, OutputsAreWrittenInPlaceAndTemporariesShareTheArena) {
  Graph g;
  Value x = g.input("x", f32({16, 16}));
  Value a = g.add(Op::kMatMul, {x, x});
  Value b = g.add(Op::kMatMul, {a, x});
  Value c = g.add(Op::kMatMul, {b, x});
  g.outputs = {g.add(Op::kMatMul, {c, x})};
  Program p = lower(g);
  EXPECT_EQ(p.temporaries_bytes, 3 * 16 * 16 * 4);
  EXPECT_EQ(p.arena_bytes, 2 * 16 * 16 * 4);  // a and c can share
  EXPECT_EQ(p.arena_lower_bound, 2 * 16 * 16 * 4);
  const Buffer& out = p.buffers[static_cast<size_t>(p.outputs[0])];
  EXPECT_EQ(out.region, Region::kOutput);
}

TEST(Lower, InputReturnedDirectlyIsCopied) {
  Graph g;
  Value x = g.input("x", f32({5}));
  g.outputs = {x, x};
  Program p = lower(g);
  EXPECT_EQ(p.kernels.size(), 2u);
  EXPECT_NE(p.outputs[0], p.outputs[1]);
}

TEST(Layout, ReshapeViews) {
  Node n;
  n.op = Op::kReshape;
  // A contiguous [2,3,4] viewed as [6,4] and [2,12].
  Layout c = contiguous_layout({2, 3, 4});
  n.attrs.ints = {6, 4};
  EXPECT_EQ(apply_view(n, c)->strides, (std::vector<int64_t>{4, 1}));
  n.attrs.ints = {2, 1, 12};
  EXPECT_EQ(apply_view(n, c)->strides, (std::vector<int64_t>{12, 0, 1}));
  // A transposed [4,3] (strides 1,4) cannot merge into [12].
  Layout t{{4, 3}, {1, 4}, 0};
  n.attrs.ints = {12};
  EXPECT_FALSE(apply_view(n, t).has_value());
  // Splitting a transposed dim is fine: [4,3] -> [2,2,3].
  n.attrs.ints = {2, 2, 3};
  EXPECT_EQ(apply_view(n, t)->strides, (std::vector<int64_t>{2, 1, 4}));
  // Broadcast dims (stride 0) merge with each other.
  Layout b{{3, 4}, {0, 0}, 0};
  n.attrs.ints = {12};
  EXPECT_EQ(apply_view(n, b)->strides, (std::vector<int64_t>{0}));
}

}  // namespace
}  // namespace chroma

namespace chroma {
namespace {

TEST(Lower, SoftmaxIsOneKernelWithItsInputFused) {
  Graph g;
  Value x = g.input("x", TensorType{DType::kF32, {3, 8}});
  Value s = g.map(EwOp::k_mul, {x, g.full(Scalar::of_float(0.5), TensorType{DType::kF32, {3, 8}})});
  Attrs a;
  a.axis = 1;
  g.outputs = {g.add(Op::kSoftmax, {s}, a)};
  Program p = lower(g);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].kind, Kernel::kSoftmax);
  EXPECT_EQ(p.kernels[0].inputs[0].kind, Expr::kMap);
}

}  // namespace
}  // namespace chroma

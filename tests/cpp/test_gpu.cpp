// Tests for the GPU generator's kernel IR, legalization and dialect printers
// (src/codegen/gpu). End-to-end runs of generated kernels are in tests/python/test_webgpu.py.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "codegen/gpu/elementwise.h"
#include "codegen/gpu/gpu_codegen.h"
#include "codegen/gpu/printer.h"

namespace {

using namespace chroma::gpu;

// y[i] = exp(x[i]) over n elements: slot 0 read, slot 1 written.
Kernel exp_kernel(int64_t n) {
  Kernel k;
  k.name = "exp";
  k.workgroup_size = 64;
  k.workgroups = (n + 63) / 64;
  k.params = 2;
  k.slots = {Slot{false}, Slot{true}};
  int counter = 0;
  Block b(&k.body, &counter);
  const Ex i = b.let(var("wg", Ty::kI32) * lit_i(64) + var("lid", Ty::kI32), "i");
  b.if_(lt(i, lit_i(n)), [&](Block& t) {
    const Ex x = t.let(bitcast(Ty::kF32, load_word(0, param(0) + i)));
    t.store(1, param(1) + i, bitcast(Ty::kU32, call("exp", Ty::kF32, {x})));
  });
  return k;
}

TEST(GpuPrinter, WgslAndCudaSpellTheSameKernel) {
  Kernel k = exp_kernel(1000);
  legalize(k, Capabilities{});
  const std::string w = print_kernel(k, wgsl_dialect());
  EXPECT_NE(w.find("@compute @workgroup_size(64)"), std::string::npos) << w;
  EXPECT_NE(w.find("var<storage, read> s0: array<u32>"), std::string::npos) << w;
  EXPECT_NE(w.find("var<storage, read_write> s1: array<u32>"), std::string::npos) << w;
  EXPECT_NE(w.find("bitcast<f32>(s0[(i32(prm.p0) + i0)])"), std::string::npos) << w;
  EXPECT_NE(w.find("let i0: i32 = ((wg * 64i) + lid);"), std::string::npos) << w;
  const std::string c = print_kernel(k, cuda_dialect());
  EXPECT_NE(c.find("__launch_bounds__(64)"), std::string::npos) << c;
  // CHROMA_SLOT(T): T* __restrict__ for nvcc, a bounds-checked slot on the emulator.
  EXPECT_NE(c.find("CHROMA_SLOT(const unsigned) s0"), std::string::npos) << c;
  EXPECT_NE(c.find("expf("), std::string::npos) << c;
  EXPECT_NE(c.find("unsigned p1"), std::string::npos) << c;
  EXPECT_EQ(c.find("bitcast<f32>"), std::string::npos) << c;
  const std::string m = print_kernel(k, msl_dialect());
  EXPECT_NE(m.find("[[max_total_threads_per_threadgroup(64)]] kernel void chroma_main("), std::string::npos) << m;
  EXPECT_NE(m.find("CHROMA_SLOT(device const uint) s0 [[buffer(1)]]"), std::string::npos) << m;  // binding 0: the params
  EXPECT_NE(m.find("CHROMA_SLOT(device uint) s1 [[buffer(2)]]"), std::string::npos) << m;
  EXPECT_NE(m.find("constant Params& prm [[buffer(0)]]"), std::string::npos) << m;
  EXPECT_NE(m.find("as_type<float>(s0[(((int)prm.p0) + i0)])"), std::string::npos) << m;
}

TEST(GpuPrinter, SubgroupKernelsEnableTheFeatureOrAreRefused) {
  Kernel k = exp_kernel(10);
  k.subgroups = true;
  const std::string w = print_kernel(k, wgsl_dialect());
  EXPECT_EQ(w.find("enable subgroups;"), w.find('\n') + 1) << w;  // right after the comment line
  EXPECT_NE(w.find("@builtin(subgroup_size) sgsize: u32"), std::string::npos) << w;
  EXPECT_NE(w.find("let sg_lane = i32(sglane);"), std::string::npos) << w;
  const std::string c = print_kernel(k, cuda_dialect());  // warps: 32 lanes, consecutive lid
  EXPECT_NE(c.find("const int sg_lane = lid & 31;"), std::string::npos) << c;
  EXPECT_EQ(c.find("enable subgroups"), std::string::npos) << c;
  Dialect none = cuda_dialect();
  none.subgroup_prologue.clear();
  EXPECT_THROW(print_kernel(k, none), Unsupported);  // a dialect without them refuses the kernel
  k.subgroups = false;
  EXPECT_EQ(print_kernel(k, wgsl_dialect()).find("subgroup"), std::string::npos);
}

TEST(GpuPrinter, BitFieldStoresAreAtomicInEveryDialect) {
  Kernel k = exp_kernel(10);
  int counter = 100;
  Block b(&k.body, &counter);
  b.store_bits(1, lit_i(3), lit_u(0x100), lit_u(0xff00));  // byte 1 of word 3 = 1
  EXPECT_THROW(print_kernel(k, wgsl_dialect()), std::logic_error);  // the slot is not marked atomic
  k.slots[1].atomic = true;
  const std::string g = print_kernel(k, wgsl_dialect());
  EXPECT_NE(g.find("var<storage, read_write> s1: array<atomic<u32>>;"), std::string::npos) << g;
  EXPECT_NE(g.find("atomicAnd(&s1[3i], ~65280u); atomicOr(&s1[3i], 256u);"), std::string::npos) << g;
  EXPECT_NE(g.find("atomicStore(&s1["), std::string::npos) << g;  // the kernel's plain store too
  EXPECT_NE(g.find("var<storage, read> s0: array<u32>;"), std::string::npos) << g;  // other slots unchanged
  const std::string c = print_kernel(k, cuda_dialect());
  EXPECT_NE(c.find("atomicAnd(&s1[3], ~65280u);"), std::string::npos) << c;
  EXPECT_NE(c.find("atomicOr(&s1[3], 256u);"), std::string::npos) << c;
  EXPECT_NE(c.find("CHROMA_SLOT(unsigned) s1"), std::string::npos) << c;
}

TEST(GpuPrinter, NonFiniteLiteralsAreNotConstantExpressions) {
  Kernel k = exp_kernel(4);
  int counter = 100;
  Block b(&k.body, &counter);
  b.mut(Ty::kF32, lit_f(-std::numeric_limits<double>::infinity()), "m");
  legalize(k, Capabilities{});
  const std::string w = print_kernel(k, wgsl_dialect());
  EXPECT_NE(w.find("chroma_f32_bits(4286578688u)"), std::string::npos) << w;  // Tint rejects bitcast<f32>(const)
}

TEST(GpuLegalize, FoldsLargeGridsAndGuardsTheSurplus) {
  Kernel k = exp_kernel(64 * 100000);
  Capabilities caps;
  caps.max_grid = 65535;
  legalize(k, caps);
  EXPECT_EQ(k.grid_x, 65535);
  EXPECT_EQ(k.grid_y, 2);
  ASSERT_FALSE(k.body.empty());
  EXPECT_EQ(k.body.front().kind, Stmt::kIf);  // if (wg >= 100000) return;
  EXPECT_NE(print_kernel(k, wgsl_dialect()).find("wgid.y * 65535u"), std::string::npos);
}

TEST(GpuLegalize, ExactGridsNeedNoGuard) {
  Kernel k = exp_kernel(64 * 10);
  legalize(k, Capabilities{});
  EXPECT_EQ(k.grid_x, 10);
  EXPECT_EQ(k.grid_y, 1);
  EXPECT_EQ(k.body.front().kind, Stmt::kLet);
}

TEST(GpuLegalize, RefusesABarrierInDivergentControlFlow) {
  Kernel k = exp_kernel(64);
  int counter = 50;
  Block b(&k.body, &counter);
  b.if_(lt(var("lid", Ty::kI32), lit_i(4)), [](Block& t) { t.barrier(); });
  EXPECT_THROW(
      {
        try {
          legalize(k, Capabilities{});
        } catch (const Unsupported& e) {
          EXPECT_NE(std::string(e.what()).find("non-uniform"), std::string::npos) << e.what();
          throw;
        }
      },
      Unsupported);
}

TEST(GpuLegalize, RefusesABarrierUnderAVariableDerivedFromLid) {
  Kernel k = exp_kernel(64);
  int counter = 50;
  Block b(&k.body, &counter);
  const Ex half = b.let(var("lid", Ty::kI32) / lit_i(2), "h");  // non-uniform through a let
  b.loop("j", lit_i(0), half, lit_i(1), [](Block& t, const Ex&) { t.barrier(); });
  EXPECT_THROW(legalize(k, Capabilities{}), Unsupported);
}

TEST(GpuLegalize, AcceptsBarriersInUniformLoops) {
  Kernel k = exp_kernel(64);
  int counter = 50;
  Block b(&k.body, &counter);
  b.loop("j", lit_i(0), lit_i(8), lit_i(1), [](Block& t, const Ex&) { t.barrier(); });
  b.if_(eq(var("wg", Ty::kI32), lit_i(0)), [](Block& t) { t.barrier(); });  // wg is uniform
  EXPECT_NO_THROW(legalize(k, Capabilities{}));
}

TEST(GpuLegalize, NamesTheLimitsAKernelExceeds) {
  Kernel k = exp_kernel(64);
  k.shared.push_back(SharedArray{"big", Ty::kF32, 8192});
  try {
    legalize(k, Capabilities{});
    FAIL() << "expected Unsupported";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("32768 bytes of workgroup memory"), std::string::npos) << e.what();
  }
  Kernel w = exp_kernel(64);
  w.workgroup_size = 512;
  EXPECT_THROW(legalize(w, Capabilities{}), Unsupported);
}

TEST(GpuElementwise, NarrowsInt64SentinelsOnly) {
  EXPECT_EQ(narrow_int64(INT64_MAX), INT32_MAX);
  EXPECT_EQ(narrow_int64(INT64_MIN), INT32_MIN);
  EXPECT_EQ(narrow_int64(-INT64_MAX), INT32_MIN);
  EXPECT_EQ(narrow_int64(5000000000ll), 5000000000ll);  // out of range, not a sentinel: refused later
  EXPECT_EQ(narrow_int64(-7), -7);
}

TEST(GpuElementwise, Float64HasNoGpuType) { EXPECT_THROW(compute_type(chroma::DType::kF64), Unsupported); }

}  // namespace

// Weight shards (src/artifact/common.h): tensors fill shards up to the binding limit, never
// straddling two; one larger than the limit gets a shard of its own.
#include "artifact/common.h"

namespace {

chroma::ConstantData bytes_constant(int64_t n, uint8_t fill) {
  chroma::ConstantData c;
  c.type.dtype = chroma::DType::kU8;
  c.type.shape = {n};
  c.bytes = chroma::make_blob(std::vector<uint8_t>(static_cast<size_t>(n), fill));
  return c;
}

TEST(WeightShards, OversizedTensorGetsItsOwnShard) {
  chroma::WeightsLayout wl(4, 1024, nullptr, 256);
  const int64_t a = wl.add(bytes_constant(600, 1), "a");
  const int64_t b = wl.add(bytes_constant(3000, 2), "b");  // above the limit: alone
  const int64_t c = wl.add(bytes_constant(300, 3), "c");
  const int64_t d = wl.add(bytes_constant(500, 4), "d");
  ASSERT_EQ(wl.shards.size(), 3u);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(wl.shard_of(a), 0);
  EXPECT_EQ(wl.shard_of(b), 1);
  EXPECT_EQ(b % 256, 0);
  EXPECT_EQ(wl.shards[1].second - wl.shards[1].first, 3000);
  EXPECT_EQ(wl.shard_of(c), 2);
  EXPECT_EQ(wl.shard_of(d), 2);  // 300 + 500 fit in one shard
  for (const auto& [s, e] : wl.shards) EXPECT_LE(e - s, 3000);
  EXPECT_EQ(wl.bytes[static_cast<size_t>(b)], 2);
  EXPECT_EQ(wl.bytes[static_cast<size_t>(d + 499)], 4);
}

}  // namespace

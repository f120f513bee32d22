// The CPU SIMT emulator (include/chroma/simt): barriers, shared memory, subgroup operations,
// the divergence checks and the reverse order that exposes a missing barrier; and kernels
// printed by the CUDA dialect, compiled as C++ against the emulator's header and run.
#include "chroma/simt/cuda.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "codegen/gpu/gpu_codegen.h"
#include "codegen/gpu/printer.h"

namespace {

namespace simt = chroma::simt;

// A tree reduction in shared memory, as the generator's reduce template does it: each
// workgroup sums its 256 values; with or without the barrier between the steps.
std::vector<float> block_sums(const std::vector<float>& x, bool barriers, bool reverse) {
  const unsigned groups = static_cast<unsigned>(x.size() / 256);
  std::vector<float> out(groups);
  simt::Options opt;
  opt.reverse = reverse;
  simt::launch({groups, 1, 1}, {256, 1, 1}, [&] {
    __shared__ float part[256];
    const unsigned t = threadIdx.x;
    part[t] = x[blockIdx.x * 256 + t];
    if (barriers) __syncthreads();
    for (unsigned s = 128; s > 0; s >>= 1) {
      if (t < s) part[t] += part[t + s];
      if (barriers) __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = part[0];
  }, opt);
  return out;
}

TEST(Simt, BarriersOrderSharedMemoryInEitherOrder) {
  std::vector<float> x(4 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7) % 13);
  for (bool reverse : {false, true}) {
    const std::vector<float> s = block_sums(x, true, reverse);
    ASSERT_EQ(s.size(), 4u);
    for (size_t g = 0; g < 4; ++g) {
      EXPECT_EQ(s[g], std::accumulate(x.begin() + static_cast<long>(g * 256), x.begin() + static_cast<long>(g * 256 + 256), 0.0f));
    }
  }
}

TEST(Simt, ReverseOrderExposesAMissingBarrier) {
  // Without barriers each invocation runs to its end before the next starts, reading whatever
  // its neighbours have (not) written yet: the two orders disagree, and at least one is wrong.
  std::vector<float> x(256, 1.0f);
  const float fwd = block_sums(x, false, false)[0], rev = block_sums(x, false, true)[0];
  EXPECT_NE(fwd, rev);
  EXPECT_TRUE(fwd != 256.0f || rev != 256.0f);
}

TEST(Simt, SubgroupShufflesAndReductions) {
  std::vector<int> sum(64), mx(64), down(64), xr(64), bal(64);
  simt::launch({1, 1, 1}, {64, 1, 1}, [&] {
    const int t = static_cast<int>(threadIdx.x);
    sum[t] = __reduce_add_sync(0xffffffffu, t);
    mx[t] = __reduce_max_sync(0xffffffffu, (t * 37) % 64);
    down[t] = __shfl_down_sync(0xffffffffu, t * 10, 1);
    xr[t] = __shfl_xor_sync(0xffffffffu, t, 3);
    bal[t] = static_cast<int>(__ballot_sync(0xffffffffu, t % 3 == 0));
  });
  for (int t = 0; t < 64; ++t) {
    const int w = t / 32 * 32;
    EXPECT_EQ(sum[t], 32 * w + 496) << t;  // w + (w+1) + ... + (w+31)
    int m = 0;
    for (int i = w; i < w + 32; ++i) m = std::max(m, (i * 37) % 64);
    EXPECT_EQ(mx[t], m) << t;
    EXPECT_EQ(down[t], t % 32 == 31 ? t * 10 : (t + 1) * 10) << t;  // past the warp: its own value
    EXPECT_EQ(xr[t], w + ((t - w) ^ 3)) << t;
    unsigned b = 0;
    for (int i = 0; i < 32; ++i) b |= ((w + i) % 3 == 0 ? 1u : 0u) << i;
    EXPECT_EQ(static_cast<unsigned>(bal[t]), b) << t;
  }
}

TEST(SimtDeathTest, BarrierInDivergentControlFlowAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(simt::launch({1, 1, 1}, {64, 1, 1}, [] {
                 if (threadIdx.x < 10) __syncthreads();
               }),
               "deadlock, a barrier or subgroup operation in divergent control flow.*returned");
  EXPECT_DEATH(simt::launch({1, 1, 1}, {64, 1, 1}, [] {
                 if (threadIdx.x < 10) {
                   __syncthreads();
                 } else {
                   __syncthreads();
                 }
               }),
               "invocations wait at different barriers");
  EXPECT_DEATH(simt::launch({1, 1, 1}, {32, 1, 1}, [] {
                 if (threadIdx.x != 5) (void)__reduce_add_sync(0xffffffffu, 1);
               }),
               "deadlock");
  EXPECT_DEATH(simt::thread_id(), "outside an emulated launch");
}

// --- kernels printed by the CUDA dialect, compiled against the emulator ---

std::string run_cmd(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const std::string& a : argv) cmd += "'" + a + "' ";
  cmd += "2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "" : (out.empty() ? "failed" : out);
}

TEST(Simt, PrintedCudaKernelRunsOnTheEmulator) {
  using namespace chroma::gpu;
  // y[i] = exp(x[i]) * 2 over n elements, then per workgroup of 64 the sum of y through shared
  // memory and barriers: slot 0 read, slot 1 and 2 written.
  const int64_t n = 1000, wgs = 64;
  Kernel k;
  k.name = "exp_sum";
  k.workgroup_size = wgs;
  k.workgroups = (n + wgs - 1) / wgs;
  k.params = 1;
  k.slots = {Slot{false}, Slot{true}, Slot{true}};
  k.shared = {SharedArray{"part", Ty::kF32, wgs}};
  int counter = 0;
  Block b(&k.body, &counter);
  const Ex i = b.let(var("wg", Ty::kI32) * lit_i(wgs) + var("lid", Ty::kI32), "i");
  const Ex y = b.mut(Ty::kF32, lit_f(0.0), "y");
  b.if_(lt(i, lit_i(n)), [&](Block& t) {
    const Ex x = t.let(bitcast(Ty::kF32, load_word(0, param(0) + i)));
    t.assign(y, call("exp", Ty::kF32, {x}) * lit_f(2.0));
    t.store(1, i, bitcast(Ty::kU32, y));
  });
  b.shared_store("part", var("lid", Ty::kI32), y);
  b.barrier();
  b.if_(eq(var("lid", Ty::kI32), lit_i(0)), [&](Block& t) {
    const Ex s = t.mut(Ty::kF32, lit_f(0.0), "s");
    t.loop("j", lit_i(0), lit_i(wgs), lit_i(1), [&](Block& l, const Ex& j) {
      l.assign(s, s + load_array(Space::kShared, "part", Ty::kF32, j));
    });
    t.store(2, var("wg", Ty::kI32), bitcast(Ty::kU32, s));
  });
  legalize(k, Capabilities{});
  const std::string code = print_kernel(k, cuda_dialect());

  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("chroma-simt-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "k.cpp");
    f << "#include \"chroma/simt/cuda.h\"\n"
      << code
      << "\nextern \"C\" int launch(unsigned** s, const unsigned long long* w, unsigned p0, unsigned groups, int reverse) {\n"
      << "  chroma::simt::Options o; o.reverse = reverse != 0;\n"
      << "  chroma::simt::g_slot_fault = {};\n"
      << "  auto slot = [&](int i) { return chroma::simt::SlotArg{s[i], w[i], i}; };\n"
      << "  chroma::simt::launch({groups, 1, 1}, {" << wgs << ", 1, 1}, [&] { chroma_main(slot(0), slot(1), slot(2), p0); }, o);\n"
      << "  return chroma::simt::g_slot_fault.set ? 1 : 0;\n}\n";
  }
  const char* cxx = std::getenv("CXX");
  const std::string err = run_cmd({cxx && *cxx ? cxx : "c++", "-std=c++20", "-O1", "-fPIC", "-shared", "-I" CHROMA_SOURCE_DIR "/include",
                                   "-o", (dir / "k.so").string(), (dir / "k.cpp").string()});
  ASSERT_EQ(err, "") << code;
  void* lib = dlopen((dir / "k.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto launch = reinterpret_cast<int (*)(unsigned**, const unsigned long long*, unsigned, unsigned, int)>(dlsym(lib, "launch"));
  ASSERT_NE(launch, nullptr);
  const int64_t groups = k.workgroups;
  for (int reverse : {0, 1}) {
    std::vector<float> x(static_cast<size_t>(n + 3)), yv(static_cast<size_t>(n)), sums(static_cast<size_t>(groups));
    for (size_t j = 0; j < x.size(); ++j) x[j] = std::sin(static_cast<float>(j)) * 3.0f;
    unsigned* slots[3] = {reinterpret_cast<unsigned*>(x.data()), reinterpret_cast<unsigned*>(yv.data()),
                          reinterpret_cast<unsigned*>(sums.data())};
    const unsigned long long words[3] = {x.size(), yv.size(), sums.size()};
    EXPECT_EQ(launch(slots, words, 3u, static_cast<unsigned>(groups), reverse), 0);  // param 0: read from x[3]
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(yv[static_cast<size_t>(j)], std::exp(x[static_cast<size_t>(j + 3)]) * 2.0f) << j;
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int64_t j = g * wgs; j < std::min(n, (g + 1) * wgs); ++j) s += yv[static_cast<size_t>(j)];
      EXPECT_EQ(sums[static_cast<size_t>(g)], s) << g;
    }
  }
  // A parameter pointing past a slot's buffer: the access is not made, the launch reports it.
  {
    std::vector<float> x(static_cast<size_t>(n + 3)), yv(static_cast<size_t>(n)), sums(static_cast<size_t>(groups));
    unsigned* slots[3] = {reinterpret_cast<unsigned*>(x.data()), reinterpret_cast<unsigned*>(yv.data()),
                          reinterpret_cast<unsigned*>(sums.data())};
    const unsigned long long words[3] = {x.size(), yv.size(), sums.size()};
    EXPECT_EQ(launch(slots, words, 1u << 30, static_cast<unsigned>(groups), 0), 1);
  }
  dlclose(lib);
  fs::remove_all(dir);
}

}  // namespace

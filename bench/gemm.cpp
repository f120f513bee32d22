// gemm: float32 matrix products on one thread, OpenBLAS against oneDNN's sgemm, on the shapes
// the zoo's models bring (linear layers of ViT, Swin, BERT/MiniLM, ResNet's 1x1 convolutions,
// attention blocks). The evidence for chroma/cpu/sgemm.h's choices (docs/cpu_kernels.md,
// "Threads and the product library").
//
//   g++ -O2 -march=native bench/gemm.cpp -o gemm -lopenblas -ldnnl
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ./gemm [runs=9]
//
// C[m x n] = A[m x k] B^T (B stored [n x k], as a linear layer's weight). Per shape, `runs`
// rounds; each round times every variant once (the variants alternating, so drift of a
// shared machine hits all of them), a timed call being as many products as take about
// 20 ms. Prints one line per shape with the median GFLOP/s of each variant:
//   openblas      cblas_sgemm
//   onednn        dnnl_sgemm, one call
//   onednn_blk    dnnl_sgemm in blocks of at most 768 columns when n > 1024 (what sgemm.h does)
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void onednn_blocked(int m, int n, int k, const float* A, const float* B, float* C) {
  if (n <= 1024) {
    dnnl_sgemm('N', 'T', m, n, k, 1.f, A, k, B, k, 0.f, C, n);
    return;
  }
  const int pieces = (n + 767) / 768, width = ((n + pieces - 1) / pieces + 15) / 16 * 16;
  for (int j = 0; j < n; j += width) {
    dnnl_sgemm('N', 'T', m, std::min(width, n - j), k, 1.f, A, k, B + static_cast<size_t>(j) * k, k, 0.f, C + j, n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 9;
  const int shapes[][3] = {
      {3136, 96, 96},  {3136, 384, 96}, {3136, 96, 384}, {784, 768, 192},  {196, 1536, 384}, {196, 384, 1536},
      {49, 3072, 768}, {49, 768, 3072}, {197, 2304, 768}, {197, 768, 768}, {197, 3072, 768}, {197, 768, 3072},
      {128, 384, 384}, {128, 1536, 384}, {1024, 384, 384}, {1024, 1536, 384}, {1024, 384, 1536}, {49, 49, 32},
  };
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> u(-1, 1);
  std::printf("%5s %5s %5s %10s %10s %10s   (GFLOP/s, median of %d)\n", "m", "n", "k", "openblas", "onednn", "onednn_blk",
              runs);
  for (const auto& s : shapes) {
    const int m = s[0], n = s[1], k = s[2];
    std::vector<float> A(static_cast<size_t>(m) * k), B(static_cast<size_t>(n) * k), C(static_cast<size_t>(m) * n);
    for (float& x : A) x = u(rng);
    for (float& x : B) x = u(rng);
    const double flop = 2.0 * m * n * k;
    const int reps = std::max(1, static_cast<int>(0.02 * 60e9 / flop));
    std::vector<std::function<void()>> variants = {
        [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, A.data(), k, B.data(), k, 0, C.data(), n); },
        [&] { dnnl_sgemm('N', 'T', m, n, k, 1.f, A.data(), k, B.data(), k, 0.f, C.data(), n); },
        [&] { onednn_blocked(m, n, k, A.data(), B.data(), C.data()); },
    };
    std::vector<std::vector<double>> gf(variants.size());
    for (auto& f : variants) f();  // warm-up: packing buffers, JIT kernels
    for (int r = 0; r < runs; ++r) {
      for (size_t v = 0; v < variants.size(); ++v) {
        const double t0 = now();
        for (int i = 0; i < reps; ++i) variants[v]();
        gf[v].push_back(flop * reps / (now() - t0) / 1e9);
      }
    }
    std::printf("%5d %5d %5d", m, n, k);
    for (auto& g : gf) {
      std::sort(g.begin(), g.end());
      std::printf(" %10.1f", g[g.size() / 2]);
    }
    std::printf("\n");
  }
  return 0;
}

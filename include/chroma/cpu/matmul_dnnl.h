// chroma::et::matmul_bf16_dnnl: a bfloat16 model's matrix product with many rows on oneDNN's
// bfloat16 matmul (AMX where the CPU has it, else AVX512-BF16), the library and the kernels
// eager PyTorch runs for a bfloat16 nn.Linear on the CPU.
//
// C[M x N] = A[M x K] B[K x N]: A float32 holding bfloat16 values (what widen_half makes of a
// bfloat16 activation; Lowerer::bf16_valued), rows lda apart; B the model's bfloat16 weight
// as it is stored (any strides: a Linear's weight is read transposed); C float32, rows ldc
// apart. The products are exact in float32 and summed in float32, eager's arithmetic. The
// lowering picks this for at least kDnnlBf16Rows rows (Lowerer::bf16_dnnl_matmul); fewer
// rows are memory-bound and run Chroma's own bf16 kernels (gemm_quant.h), which stream the
// packed weights faster.
//
// Per call site one cache, as for convolutions (conv_dnnl.h): for each weights address and
// thread count, the rows cut into one range per thread, each its own primitive made for one
// thread (oneDNN never starts an OpenMP team), with its own bfloat16 copy of its rows of A
// (converted by to_bf16: exact) and scratchpad; the weights reordered once into the layout
// the primitive wants, shared by the ranges that want the same. Where the CPU has no
// bfloat16 instructions, or oneDNN refuses, the product runs on oneDNN's sgemm against a
// float32 copy of B made once (the same values, summed in another order).
#pragma once

#include <omp.h>

#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <utility>
#include <vector>

#include "chroma/cpu/dnnl_bf16.h"
#include "chroma/cpu/sgemm.h"
#include "chroma/cpu/threads.h"
#include "chroma/half.h"

namespace chroma::et {

namespace mm_detail {

struct Part {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  dnnl::matmul mm;
  dnnl::memory xb, y_user, scratch;  // xb: this part's rows of A in bfloat16 (dense)
  std::shared_ptr<dnnl::memory> wm;
  int64_t r0 = 0, rows = 0, k = 0;
};

// The primitive for rows [r0, r0 + rows); `share`: an earlier part whose reordered weights
// this one takes when it wants the same layout.
inline std::unique_ptr<Part> make(int64_t r0, int64_t rows, int64_t N, int64_t K, const uint16_t* B, int64_t sk, int64_t sn,
                                  int64_t ldc, const Part* share) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  auto p = std::make_unique<Part>();
  p->r0 = r0;
  p->rows = rows;
  p->k = K;
  const dnnl::memory::desc xb_md({rows, K}, dt::bf16, tag::ab);
  const dnnl::memory::desc w_any({K, N}, dt::bf16, tag::any);
  const dnnl::memory::desc y_md({rows, N}, dt::f32, dnnl::memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(p->eng, xb_md, w_any, y_md, attr);
  if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) throw dnnl::error(dnnl_unimplemented, "reference matmul only");
  p->mm = dnnl::matmul(pd);
  p->scratch = dnnl::memory(pd.scratchpad_desc(), p->eng);
  p->xb = dnnl::memory(xb_md, p->eng);
  p->y_user = dnnl::memory(y_md, p->eng, DNNL_MEMORY_NONE);
  if (share && share->wm->get_desc() == pd.weights_desc()) {
    p->wm = share->wm;
    return p;
  }
  dnnl::memory w_user({{K, N}, dt::bf16, dnnl::memory::dims{sk, sn}}, p->eng, const_cast<uint16_t*>(B));
  p->wm = std::make_shared<dnnl::memory>(pd.weights_desc(), p->eng);
  dnnl::reorder(w_user, *p->wm).execute(p->st, w_user, *p->wm);
  p->st.wait();
  return p;
}

inline void run(Part& p, const float* A, int64_t lda, float* C, int64_t ldc) {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  auto* xb = static_cast<uint16_t*>(p.xb.get_data_handle());
  const int64_t K = p.k;
  for (int64_t i = 0; i < p.rows; ++i) to_bf16(A + (p.r0 + i) * lda, xb + i * K, K);
  p.y_user.set_data_handle(C + p.r0 * ldc);
  p.mm.execute(p.st, {{DNNL_ARG_SRC, p.xb}, {DNNL_ARG_WEIGHTS, *p.wm}, {DNNL_ARG_DST, p.y_user}, {DNNL_ARG_SCRATCHPAD, p.scratch}});
  p.st.wait();
}

}  // namespace mm_detail

// Rows at which the lowering sends a bfloat16 model's product here (at 16 rows Chroma's own
// kernels were faster than oneDNN's, at 64 slower: bench/results/README.md).
inline constexpr int64_t kDnnlBf16Rows = 32;

struct MatmulCache {
  std::mutex m;
  std::map<std::pair<const void*, int>, std::vector<std::unique_ptr<mm_detail::Part>>> by_weights;
  std::map<const void*, std::vector<float>> widened;  // B in float32, for the sgemm path
  bool refused = false;
};

inline void matmul_bf16_dnnl(MatmulCache& cache, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                             const uint16_t* B, int64_t sk, int64_t sn, float* C, int64_t ldc, rt::ThreadPool* pool) {
  const int threads = pool ? pool->size() : 1;
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  std::vector<std::unique_ptr<mm_detail::Part>>* parts = nullptr;
  const std::vector<float>* wide = nullptr;
  {
    std::lock_guard<std::mutex> lk(cache.m);
    if (!cache.refused && dnnl_bf16_kernels()) {
      const std::pair<const void*, int> key{B, threads};
      auto it = cache.by_weights.find(key);
      if (it == cache.by_weights.end()) {
        try {
          std::vector<std::unique_ptr<mm_detail::Part>> made;
          const int64_t n_parts = std::max<int64_t>(1, std::min<int64_t>(threads, M / 16));
          for (int64_t t = 0; t < n_parts; ++t) {
            const int64_t b = M * t / n_parts, e = M * (t + 1) / n_parts;
            made.push_back(mm_detail::make(b, e - b, N, K, B, sk, sn, ldc, made.empty() ? nullptr : made.front().get()));
          }
          it = cache.by_weights.emplace(key, std::move(made)).first;
        } catch (const dnnl::error&) {
          cache.refused = true;
        }
      }
      if (!cache.refused) parts = &it->second;
    }
    if (!parts) {
      auto& w = cache.widened[B];
      if (w.empty()) {
        w.resize(static_cast<size_t>(K * N));
        for (int64_t q = 0; q < K; ++q)
          for (int64_t j = 0; j < N; ++j) w[static_cast<size_t>(q * N + j)] = half_detail::bf16_to_f32(B[q * sk + j * sn]);
      }
      wide = &w;
    }
  }
  if (!parts) {
    sgemm(pool, false, false, M, N, K, A, lda, wide->data(), N, C, ldc);
    return;
  }
  if (parts->size() == 1 || threads <= 1) {
    for (auto& part : *parts) mm_detail::run(*part, A, lda, C, ldc);
    return;
  }
  pool->parallel_for(static_cast<int64_t>(parts->size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) mm_detail::run(*(*parts)[static_cast<size_t>(i)], A, lda, C, ldc);
  });
}

}  // namespace chroma::et

// chroma::et::conv_dnnl: float32 convolutions through oneDNN (Debian's libdnnl), the library
// eager PyTorch also uses on the CPU. Built into an artifact when Chroma was built with
// oneDNN's headers present and the program is compiled with blas=True; every other case
// (float64, blas=False, a geometry oneDNN refuses) runs chroma::et::conv (conv.h).
//
// Per call site one Cache: for each weights address (one per loaded program) it holds the
// primitive, chosen with format `any` so oneDNN picks its blocked layouts (brgconv on
// AVX-512), the weights reordered into that layout once, on the first call, and blocked
// source and destination buffers; each call reorders the NC(D)HW input in, convolves and
// reorders the result out, like eager PyTorch does. These buffers and the reordered weights
// live outside the arena (oneDNN owns them) until the process ends.
#pragma once

#include <omp.h>

#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>

#include "chroma/cpu/conv.h"

namespace chroma::et {

namespace dnnl_detail {

struct Prim {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  dnnl::convolution_forward conv;
  dnnl::memory x_user, y_user, w_user, xm, ym, wm;
  bool reorder_x = false, reorder_y = false;
  dnnl::reorder rx, ry;
};

inline dnnl::memory::format_tag plain(int d) {
  using ft = dnnl::memory::format_tag;
  return d == 1 ? ft::ncw : d == 2 ? ft::nchw : ft::ncdhw;
}

inline dnnl::memory::format_tag plain_weights(int d, bool grouped) {
  using ft = dnnl::memory::format_tag;
  if (grouped) return d == 1 ? ft::goiw : d == 2 ? ft::goihw : ft::goidhw;
  return d == 1 ? ft::oiw : d == 2 ? ft::oihw : ft::oidhw;
}

// g is normalised to 3 spatial dims with leading unit dims; d is the real spatial rank.
inline std::unique_ptr<Prim> make(const ConvGeom& g, int d, const float* w) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  auto p = std::make_unique<Prim>();
  dims src = {g.n, g.c}, dst = {g.n, g.cout}, strides, pad, dil;
  for (int i = 3 - d; i < 3; ++i) {
    src.push_back(g.in[i]);
    dst.push_back(g.out[i]);
    strides.push_back(g.stride[i]);
    pad.push_back(g.pad[i]);
    dil.push_back(g.dil[i] - 1);  // oneDNN counts dilation from 0
  }
  const bool grouped = g.groups > 1;
  dims wei = grouped ? dims{g.groups, g.cout / g.groups, g.c / g.groups} : dims{g.cout, g.c};
  for (int i = 3 - d; i < 3; ++i) wei.push_back(g.k[i]);
  const auto any = dnnl::memory::format_tag::any;
  dnnl::memory::desc src_any(src, dt::f32, any), dst_any(dst, dt::f32, any), wei_any(wei, dt::f32, any);
  dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_any,
                                       wei_any, dst_any, strides, dil, pad, pad);
  dnnl::convolution_forward::primitive_desc pd(desc, p->eng);
  p->conv = dnnl::convolution_forward(pd);
  dnnl::memory::desc x_md(src, dt::f32, plain(d)), y_md(dst, dt::f32, plain(d));
  p->x_user = dnnl::memory(x_md, p->eng, DNNL_MEMORY_NONE);
  p->y_user = dnnl::memory(y_md, p->eng, DNNL_MEMORY_NONE);
  p->reorder_x = pd.src_desc() != x_md;
  p->reorder_y = pd.dst_desc() != y_md;
  p->xm = p->reorder_x ? dnnl::memory(pd.src_desc(), p->eng) : p->x_user;
  p->ym = p->reorder_y ? dnnl::memory(pd.dst_desc(), p->eng) : p->y_user;
  if (p->reorder_x) p->rx = dnnl::reorder(p->x_user, p->xm);
  if (p->reorder_y) p->ry = dnnl::reorder(p->ym, p->y_user);
  p->w_user = dnnl::memory({wei, dt::f32, plain_weights(d, grouped)}, p->eng, const_cast<float*>(w));
  p->wm = dnnl::memory(pd.weights_desc(), p->eng);
  dnnl::reorder(p->w_user, p->wm).execute(p->st, p->w_user, p->wm);
  p->st.wait();
  return p;
}

}  // namespace dnnl_detail

struct DnnlCache {
  std::mutex m;
  // By (weights, threads): oneDNN fixes a primitive's work split for the thread count it
  // sees when it is created.
  std::map<std::pair<const float*, int>, std::unique_ptr<dnnl_detail::Prim>> by_weights;
  bool refused = false;  // oneDNN could not build this convolution: conv.h runs it
};

// const_weights: w is a constant of the program (reordered once per program); otherwise it
// may change between calls and is reordered on every call.
template <class Gemm>
void conv_dnnl(DnnlCache& cache, const ConvGeom& g, int d, const float* x, const float* w, float* y, bool const_weights,
               rt::ThreadPool* pool, Gemm&& gemm) {
  dnnl_detail::Prim* p = nullptr;
  bool fresh = false;
  // Before the primitive is made: it is tuned for this count (a 2-thread program whose
  // primitives were made while the calling thread's OpenMP count was 1 ran on one thread).
  const int threads = pool ? pool->size() : 1;
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  {
    std::lock_guard<std::mutex> lk(cache.m);
    if (!cache.refused) {
      const std::pair<const float*, int> key{const_weights ? w : nullptr, threads};
      auto it = cache.by_weights.find(key);
      fresh = it == cache.by_weights.end();
      if (it == cache.by_weights.end()) {
        try {
          it = cache.by_weights.emplace(key, dnnl_detail::make(g, d, w)).first;
        } catch (const dnnl::error&) {
          cache.refused = true;
        }
      }
      if (!cache.refused) p = it->second.get();
    }
  }
  if (!p) {
    conv<float>(g, x, w, y, pool, gemm);
    return;
  }
  if (!const_weights && !fresh) {
    p->w_user.set_data_handle(const_cast<float*>(w));
    dnnl::reorder(p->w_user, p->wm).execute(p->st, p->w_user, p->wm);
  }
  p->x_user.set_data_handle(const_cast<float*>(x));
  p->y_user.set_data_handle(y);
  if (p->reorder_x) p->rx.execute(p->st, p->x_user, p->xm);
  p->conv.execute(p->st, {{DNNL_ARG_SRC, p->xm}, {DNNL_ARG_WEIGHTS, p->wm}, {DNNL_ARG_DST, p->ym}});
  if (p->reorder_y) p->ry.execute(p->st, p->ym, p->y_user);
  p->st.wait();
}

}  // namespace chroma::et

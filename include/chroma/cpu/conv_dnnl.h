// chroma::et::conv_dnnl: float32 convolutions through oneDNN (Debian's libdnnl), the library
// eager PyTorch also uses on the CPU. Built into an artifact when Chroma was built with
// oneDNN's headers present and the program is compiled with blas=True; every other case
// (float64, blas=False, a geometry oneDNN refuses) runs chroma::et::conv (conv.h).
//
// Threads: a convolution never starts an OpenMP team. With a pool of T > 1 threads and
// enough work, it is cut into T slices of output channels (of groups, for a grouped one),
// each its own oneDNN primitive made for one thread, and the pool runs one slice per thread.
// oneDNN's OpenMP workers would otherwise spin after every convolution on the cores the
// pool's workers need for the next kernel (with PyTorch loaded first, its libgomp is the one
// used and it was initialised with spinning waits): mobilenet_v2 ran 4x slower at two threads
// than at one.
//
// Per call site one Cache: for each weights address (one per loaded program) and thread count
// it holds the slices: each a primitive chosen with format `any` so oneDNN picks its blocked
// layouts, the slice's weights reordered into that layout once, on the first call, blocked
// source and destination buffers and a scratchpad; each call reorders the NC(D)HW input in
// (a slice of output channels reads all input channels), convolves and reorders the slice of
// the result out, like eager PyTorch does. These buffers and the reordered weights live
// outside the arena (oneDNN owns them) until the process ends.
#pragma once

#include <omp.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "chroma/cpu/conv.h"

namespace chroma::et {

namespace dnnl_detail {

// Work (multiply-adds) below which a convolution runs as one slice.
inline constexpr int64_t kSplitMacs = int64_t{1} << 20;

struct Prim {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  dnnl::convolution_forward conv;
  dnnl::memory x_user, y_user, w_user, xm, ym, wm, scratch;
  bool reorder_x = false, reorder_y = false;
  dnnl::reorder rx, ry, rw;
  // Where this slice's channels start: input, output, and weights (elements).
  int64_t x_off = 0, y_off = 0, w_off = 0;
};

// One slice: channels [c0, c0 + c) of the input, [o0, o0 + cout) of the output, groups
// groups of the convolution.
struct Slice {
  int64_t c0, c, o0, cout, groups;
};

inline dnnl::memory::format_tag plain_weights(int d, bool grouped) {
  using ft = dnnl::memory::format_tag;
  if (grouped) return d == 1 ? ft::goiw : d == 2 ? ft::goihw : ft::goidhw;
  return d == 1 ? ft::oiw : d == 2 ? ft::oihw : ft::oidhw;
}

// An NC(D)HW tensor's channels [.., .. + ch) out of `total`: dense when n == 1 (the batch
// stride is then never used, and oneDNN's reorders are fastest on dense memory).
inline dnnl::memory::desc channel_slice(int64_t n, int64_t ch, int64_t total, const int64_t* sp, int d) {
  dnnl::memory::dims dims = {n, ch}, strides = {0, 0};
  int64_t plane = 1;
  for (int i = 3 - d; i < 3; ++i) plane *= sp[i];
  strides[0] = (n == 1 ? ch : total) * plane;
  strides[1] = plane;
  int64_t s = plane;
  for (int i = 3 - d; i < 3; ++i) {
    dims.push_back(sp[i]);
    s /= sp[i];
    strides.push_back(s);
  }
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides);
}

// g is normalised to 3 spatial dims with leading unit dims; d is the real spatial rank. The
// calling thread's OpenMP count must be 1: oneDNN fixes the work split when it creates the
// primitive.
inline std::unique_ptr<Prim> make(const ConvGeom& g, int d, const Slice& s, const float* w) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  auto p = std::make_unique<Prim>();
  const int64_t cin_g = g.c / g.groups, cout_g = g.cout / g.groups, kk = g.k[0] * g.k[1] * g.k[2];
  int64_t in_plane = 1, out_plane = 1;
  dims src = {g.n, s.c}, dst = {g.n, s.cout}, strides, pad, dil;
  for (int i = 3 - d; i < 3; ++i) {
    src.push_back(g.in[i]);
    dst.push_back(g.out[i]);
    strides.push_back(g.stride[i]);
    pad.push_back(g.pad[i]);
    dil.push_back(g.dil[i] - 1);  // oneDNN counts dilation from 0
    in_plane *= g.in[i];
    out_plane *= g.out[i];
  }
  const bool grouped = g.groups > 1;
  dims wei = grouped ? dims{s.groups, cout_g, cin_g} : dims{s.cout, s.c};
  for (int i = 3 - d; i < 3; ++i) wei.push_back(g.k[i]);
  const auto any = dnnl::memory::format_tag::any;
  dnnl::memory::desc src_any(src, dt::f32, any), dst_any(dst, dt::f32, any), wei_any(wei, dt::f32, any);
  dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_any,
                                       wei_any, dst_any, strides, dil, pad, pad);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // each slice its own: slices run at once
  dnnl::convolution_forward::primitive_desc pd(desc, attr, p->eng);
  p->conv = dnnl::convolution_forward(pd);
  p->scratch = dnnl::memory(pd.scratchpad_desc(), p->eng);
  const dnnl::memory::desc x_md = channel_slice(g.n, s.c, g.c, g.in, d), y_md = channel_slice(g.n, s.cout, g.cout, g.out, d);
  p->x_user = dnnl::memory(x_md, p->eng, DNNL_MEMORY_NONE);
  p->y_user = dnnl::memory(y_md, p->eng, DNNL_MEMORY_NONE);
  p->reorder_x = pd.src_desc() != x_md;
  p->reorder_y = pd.dst_desc() != y_md;
  p->xm = p->reorder_x ? dnnl::memory(pd.src_desc(), p->eng) : p->x_user;
  p->ym = p->reorder_y ? dnnl::memory(pd.dst_desc(), p->eng) : p->y_user;
  if (p->reorder_x) p->rx = dnnl::reorder(p->x_user, p->xm);
  if (p->reorder_y) p->ry = dnnl::reorder(p->ym, p->y_user);
  p->x_off = s.c0 * in_plane;
  p->y_off = s.o0 * out_plane;
  // Weights [Cout, C/groups, k...] (or [groups, Cout/g, C/g, k...]): a slice of output
  // channels or of groups is one contiguous run.
  p->w_off = s.o0 * cin_g * kk;
  p->w_user = dnnl::memory({wei, dt::f32, plain_weights(d, grouped)}, p->eng, const_cast<float*>(w) + p->w_off);
  p->wm = dnnl::memory(pd.weights_desc(), p->eng);
  p->rw = dnnl::reorder(p->w_user, p->wm);
  p->rw.execute(p->st, p->w_user, p->wm);
  p->st.wait();
  return p;
}

// The slices of g for `threads` threads: output channels in multiples of 8 (oneDNN's AVX2
// block), or whole groups; one slice when the convolution is small.
inline std::vector<Slice> slices(const ConvGeom& g, int threads) {
  const int64_t cin_g = g.c / g.groups, cout_g = g.cout / g.groups;
  const int64_t macs = g.n * g.cout * g.out[0] * g.out[1] * g.out[2] * cin_g * g.k[0] * g.k[1] * g.k[2];
  std::vector<Slice> out;
  if (threads <= 1 || macs < kSplitMacs) return {Slice{0, g.c, 0, g.cout, g.groups}};
  if (g.groups == 1) {
    const int64_t per = (g.cout + threads * 8 - 1) / (threads * 8) * 8;
    for (int64_t o = 0; o < g.cout; o += per) out.push_back(Slice{0, g.c, o, std::min(per, g.cout - o), 1});
  } else {
    const int64_t per = (g.groups + threads - 1) / threads;
    for (int64_t q = 0; q < g.groups; q += per) {
      const int64_t n = std::min(per, g.groups - q);
      out.push_back(Slice{q * cin_g, n * cin_g, q * cout_g, n * cout_g, n});
    }
  }
  return out;
}

inline void run(Prim& p, const float* x, const float* w, float* y, bool reorder_w) {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  if (reorder_w) {
    p.w_user.set_data_handle(const_cast<float*>(w) + p.w_off);
    p.rw.execute(p.st, p.w_user, p.wm);
  }
  p.x_user.set_data_handle(const_cast<float*>(x) + p.x_off);
  p.y_user.set_data_handle(y + p.y_off);
  if (p.reorder_x) p.rx.execute(p.st, p.x_user, p.xm);
  p.conv.execute(p.st, {{DNNL_ARG_SRC, p.xm}, {DNNL_ARG_WEIGHTS, p.wm}, {DNNL_ARG_DST, p.ym}, {DNNL_ARG_SCRATCHPAD, p.scratch}});
  if (p.reorder_y) p.ry.execute(p.st, p.ym, p.y_user);
  p.st.wait();
}

}  // namespace dnnl_detail

struct DnnlCache {
  std::mutex m;
  // By (weights, threads): the slices and their primitives depend on both.
  std::map<std::pair<const float*, int>, std::vector<std::unique_ptr<dnnl_detail::Prim>>> by_weights;
  bool refused = false;  // oneDNN could not build this convolution: conv.h runs it
};

// const_weights: w is a constant of the program (reordered once per program); otherwise it
// may change between calls and is reordered on every call.
template <class Gemm>
void conv_dnnl(DnnlCache& cache, const ConvGeom& g, int d, const float* x, const float* w, float* y, bool const_weights,
               rt::ThreadPool* pool, Gemm&& gemm) {
  std::vector<std::unique_ptr<dnnl_detail::Prim>>* parts = nullptr;
  bool fresh = false;
  const int threads = pool ? pool->size() : 1;
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  {
    std::lock_guard<std::mutex> lk(cache.m);
    if (!cache.refused) {
      const std::pair<const float*, int> key{const_weights ? w : nullptr, threads};
      auto it = cache.by_weights.find(key);
      fresh = it == cache.by_weights.end();
      if (fresh) {
        try {
          std::vector<std::unique_ptr<dnnl_detail::Prim>> made;
          for (const dnnl_detail::Slice& s : dnnl_detail::slices(g, threads)) made.push_back(dnnl_detail::make(g, d, s, w));
          it = cache.by_weights.emplace(key, std::move(made)).first;
        } catch (const dnnl::error&) {
          cache.refused = true;
        }
      }
      if (!cache.refused) parts = &it->second;
    }
  }
  if (!parts) {
    conv<float>(g, x, w, y, pool, gemm);
    return;
  }
  const bool reorder_w = !const_weights && !fresh;
  if (parts->size() == 1) {
    dnnl_detail::run(*(*parts)[0], x, w, y, reorder_w);
    return;
  }
  pool->parallel_for(static_cast<int64_t>(parts->size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dnnl_detail::run(*(*parts)[static_cast<size_t>(i)], x, w, y, reorder_w);
  });
}

}  // namespace chroma::et

// chroma::et::conv_dnnl: float32 convolutions through oneDNN 3 (docs/cpu_kernels.md), the library
// eager PyTorch also uses on the CPU. Built into an artifact when Chroma was built with
// oneDNN's headers present and the program is compiled with blas=True; every other case
// (float64, blas=False) runs chroma::et::conv (conv.h), and so does a geometry oneDNN refuses.
//
// Layouts. The lowering keeps a convolutional network's activations channels-last
// (ConvGeom::x_cl / y_cl; src/lower/channels_last.cpp says when), and each primitive is made for the memory as
// it lies: oneDNN's direct kernels (brgconv, brdgmm depthwise, jit) read and write NHWC
// without any reorder. Only when oneDNN offers nothing but its reference kernel for the
// formats given (NCHW memory, say) is the primitive made with format `any` instead, and the
// input and the result are reordered into and out of the blocked layouts it picks, as eager
// PyTorch does. Weights are reordered into the primitive's layout once per program (or on
// every call when they are not constants of the program).
//
// Threads: a convolution never starts an OpenMP team. With a pool of T > 1 threads and
// enough work, it is cut into slices, each its own oneDNN primitive made for one thread, and
// the pool runs one slice per thread: ranges of images when there are at least T, else
// ranges of output rows (the outermost spatial dimension, with the padding each range really
// has). A slice of rows, channels-last, is one dense block of memory in and out, so every
// slice still runs oneDNN's direct kernel (a slice of channels would be a strided tensor,
// which only its reference kernel takes). oneDNN's own OpenMP workers would otherwise spin
// after every convolution on the cores the pool's workers need for the next kernel (with
// PyTorch loaded first, its libgomp is the one used and it was initialised with spinning
// waits): mobilenet_v2 ran slower at two threads than at one (bench/results/README.md).
//
// bfloat16 (ConvGeom::bf16: a bfloat16 model's convolution, whose input and weights hold
// bfloat16 values): on a CPU with bfloat16 dot products (AVX512-BF16, AMX) the primitive takes
// its input and weights as bfloat16 and stores float32, eager PyTorch's arithmetic for a
// bfloat16 convolution (products exact, float32 accumulation; the graph rounds the result
// after the post-ops and the epilogue, as before). The input is converted on the way in into
// the slice's own buffer (to_bf16 for a channels-last slice the primitive reads as it lies,
// else a reorder), the weights once with their layout reorder; both conversions are exact. Without those instructions, or where oneDNN offers only its
// reference kernel in bfloat16, the float32 primitive runs (the same values up to the order
// of the sums; CHROMA_DNNL_BF16=0 forces that, dnnl_bf16.h).
//
// Per call site one Cache: for each weights address (one per loaded program) and thread count
// it holds the slices (primitive, reordered weights, shared by slices whose primitives want
// the same layout, scratchpad and any reorder buffers). They live outside the arena (oneDNN
// owns them) until the process ends.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "chroma/cpu/conv.h"
#include "chroma/cpu/dnnl_bf16.h"

namespace chroma::et {

namespace dnnl_detail {

// Work (multiply-adds) below which a convolution runs as one slice.
inline constexpr int64_t kSplitMacs = int64_t{1} << 20;
// The most result bytes a slice stores when its result is read again at once (slices()).
inline constexpr int64_t kBlockBytes = int64_t{512} << 10;

// Images [n0, n0 + nn) and output rows [r0, r0 + rows) of the outermost spatial dimension.
struct Slice {
  int64_t n0, nn, r0, rows;
};

struct Prim {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  dnnl::convolution_forward conv;
  dnnl::memory x_user, y_user, w_user, xm, ym, scratch;
  std::unordered_map<int, dnnl::memory> args;  // the convolution's, weights and buffers aside
  std::vector<float> scalars;                   // the literal operands of binary post-ops
  int64_t y_elems = 0;                          // the slice's output block (the epilogue's n)
  std::shared_ptr<dnnl::memory> wm;
  bool reorder_x = false, reorder_y = false;
  // bfloat16: the slice's input (dense, channels-last) converted by to_bf16 into xm, x_elems
  // of them, instead of by a reorder.
  bool convert_x = false;
  int64_t x_elems = 0;
  dnnl::reorder rx, ry, rw;
  int64_t x_off = 0, y_off = 0;  // where this slice's input and output start (elements)
  // A strided 1x1 convolution run as a unit-stride one (unit_stride()): the input pixels it
  // reads, gathered (gather_pixels) into `compact` (dense, channels-last) before each run.
  std::vector<float> compact;
  ConvGeom geom{};
  int g_first = 0;
  int64_t g_n0 = 0, g_nn = 0, g_r0 = 0, g_rows = 0;
};

inline dnnl::memory::format_tag plain_weights(int d, bool grouped) {
  using ft = dnnl::memory::format_tag;
  if (grouped) return d == 1 ? ft::goiw : d == 2 ? ft::goihw : ft::goidhw;
  return d == 1 ? ft::oiw : d == 2 ? ft::oihw : ft::oidhw;
}

// Images [n0, n0 + nn) and outer rows [r0, r0 + rows) of a tensor [n, c, sp...] (sp: the last
// d of the 3 normalised spatial sizes), NC(D)HW or channels-last. *offset: the element where
// the block starts. A block of one image gets the dense batch stride (never used to address,
// and oneDNN's kernels recognise only dense NHWC).
inline dnnl::memory::desc block_desc(int64_t n, int64_t c, const int64_t* sp, int d, bool cl, int64_t n0, int64_t nn,
                                     int64_t r0, int64_t rows, int64_t* offset) {
  (void)n;
  const int first = 3 - d;
  dnnl::memory::dims dims = {nn, c}, strides(static_cast<size_t>(2 + d), 0);
  for (int i = first; i < 3; ++i) dims.push_back(i == first ? rows : sp[i]);
  // The whole tensor's strides: the spatial dims innermost first, after the channel when
  // channels-last.
  int64_t s = cl ? c : 1;
  for (int i = d - 1; i >= 0; --i) {
    strides[static_cast<size_t>(2 + i)] = s;
    s *= sp[first + i];
  }
  strides[1] = cl ? 1 : s;
  strides[0] = cl ? s : c * s;
  *offset = n0 * strides[0] + r0 * strides[2];
  if (nn == 1 && cl) strides[0] = strides[2] * rows;
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides);
}

inline bool is_reference(const dnnl::convolution_forward::primitive_desc& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

// oneDNN's convolution as im2col and a product ("gemm:jit", "x64:gemm:jit").
inline bool is_im2col(const dnnl::convolution_forward::primitive_desc& pd) {
  return std::string(pd.impl_info_str()).find("gemm") != std::string::npos;
}

// A dense memory of dims in the channels-last or the plain order (a slice's own copy).
inline dnnl::memory::desc dense_desc(const dnnl::memory::dims& dims, dnnl::memory::data_type t, bool cl) {
  using ft = dnnl::memory::format_tag;
  const size_t d = dims.size() - 2;
  if (cl) return dnnl::memory::desc(dims, t, d == 1 ? ft::nwc : d == 2 ? ft::nhwc : ft::ndhwc);
  return dnnl::memory::desc(dims, t, d == 1 ? ft::ncw : d == 2 ? ft::nchw : ft::ncdhw);
}

// A 1x1 convolution with a stride above 1 and no padding reads one input pixel per output
// pixel: the same as a unit-stride one on those pixels alone. oneDNN 2.6 has no 1x1 kernel
// for strided channels-last input on AVX2 (its general direct kernel runs it several times
// more slowly: bench/results/README.md), so
// make() gathers the pixels into a dense copy and runs the unit-stride 1x1 kernel when that
// is what oneDNN offers for the copy and not for the strided original.
inline bool unit_stride_candidate(const ConvGeom& g) {
  bool strided = false;
  for (int i = 0; i < 3; ++i) {
    if (g.k[i] != 1 || g.pad[i] != 0) return false;
    strided = strided || g.stride[i] > 1;
  }
  return strided && g.x_cl;
}

inline bool one_by_one_kernel(const dnnl::convolution_forward::primitive_desc& pd) {
  return std::string(pd.impl_info_str()).find("1x1") != std::string::npos;
}

// The input pixels of images [n0, n0 + nn) and output rows [r0, r0 + rows) of spatial
// dimension `first` (the outermost real one; g's dims normalised to 3) for a 1x1 convolution
// without padding, channels-last: pixel (o0, o1, o2) of the copy is input pixel
// (o0 * s0, o1 * s1, o2 * s2).
inline void gather_pixels(const ConvGeom& g, int first, const float* x, float* dst, int64_t n0, int64_t nn, int64_t r0,
                          int64_t rows) {
  int64_t lo[3] = {0, 0, 0}, hi[3] = {g.out[0], g.out[1], g.out[2]};
  lo[first] = r0;
  hi[first] = r0 + rows;
  const int64_t c = g.c;
  const size_t bytes = static_cast<size_t>(c) * sizeof(float);
  for (int64_t n = n0; n < n0 + nn; ++n) {
    for (int64_t o0 = lo[0]; o0 < hi[0]; ++o0) {
      for (int64_t o1 = lo[1]; o1 < hi[1]; ++o1) {
        const float* src = x + (((n * g.in[0] + o0 * g.stride[0]) * g.in[1] + o1 * g.stride[1]) * g.in[2]) * c;
        for (int64_t o2 = lo[2]; o2 < hi[2]; ++o2, dst += c) std::memcpy(dst, src + o2 * g.stride[2] * c, bytes);
      }
    }
  }
}

// A slice's convolution but for its input and output: the weights' dims, the bias, oneDNN's
// strides, dilation (counted from 0) and padding (on the outer dimension, the slice's own),
// and the attributes (a scratchpad of the slice's own, the post-ops).
struct ConvDesc {
  dnnl::memory::dims wei, strides, dil, pad_l, pad_r;
  bool bias = false;
  dnnl::memory::desc bias_md;
  dnnl::primitive_attr attr;
};

// Slice s's strides, dilation and padding into *c; *in_r0 and *in_r1: the first and last rows
// of the outer spatial dimension (first = 3 - d) it reads.
inline void slice_geometry(const ConvGeom& g, int d, const Slice& s, ConvDesc* c, int64_t* in_r0, int64_t* in_r1) {
  const int first = 3 - d;
  // The input rows this slice reads and the padding it really has on each side.
  const int64_t top = s.r0 * g.stride[first] - g.pad[first];
  const int64_t bottom = (s.r0 + s.rows - 1) * g.stride[first] - g.pad[first] + (g.k[first] - 1) * g.dil[first];
  *in_r0 = std::max<int64_t>(top, 0);
  *in_r1 = std::min<int64_t>(bottom, g.in[first] - 1);
  for (int i = first; i < 3; ++i) {
    c->strides.push_back(g.stride[i]);
    c->dil.push_back(g.dil[i] - 1);  // oneDNN counts dilation from 0
    if (i == first) {
      c->pad_l.push_back(*in_r0 - top);
      c->pad_r.push_back(bottom - *in_r1);
    } else {
      c->pad_l.push_back(g.pad[i]);
      c->pad_r.push_back((g.out[i] - 1) * g.stride[i] + (g.k[i] - 1) * g.dil[i] + 1 - g.in[i] - g.pad[i]);
    }
  }
}

// The bias and the post-ops (ConvPostOp) as c's attributes, their operands bound in p->args;
// a per-channel operand is a [1, Cout, 1...] tensor.
inline void add_post_ops(const ConvGeom& g, int d, const ConvPostOp* ops, int nops, Prim* p, ConvDesc* c) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  c->attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // each slice its own: slices run at once
  c->bias = nops > 0 && ops[0].kind == ConvPostOp::kBias;
  c->bias_md = dnnl::memory::desc({g.cout}, dt::f32, dnnl::memory::format_tag::x);
  dims chan(static_cast<size_t>(2 + d), 1);
  chan[1] = g.cout;
  const auto plain = d == 1 ? dnnl::memory::format_tag::abc : d == 2 ? dnnl::memory::format_tag::abcd : dnnl::memory::format_tag::abcde;
  const dnnl::memory::desc chan_md(chan, dt::f32, plain);
  if (c->bias) p->args[DNNL_ARG_BIAS] = dnnl::memory(c->bias_md, p->eng, const_cast<float*>(ops[0].c));
  // The arithmetic as binary post-ops: per-channel vectors, or a literal as a one-element
  // tensor (y - 0.5 is y + (-0.5), the same rounding as eager's). No eltwise post-ops: oneDNN
  // 2.6's relu and clip turn NaN into 0 or the lower bound (eager keeps NaN), and its brgconv
  // applies the first eltwise post-op's parameters to every later one; clamps and the rest are
  // the generated epilogue's (ConvEpilogue), run on the block just stored.
  p->scalars.reserve(static_cast<size_t>(2 * nops));  // stable addresses for the memories below
  dims one(static_cast<size_t>(2 + d), 1);
  const dnnl::memory::desc one_md(one, dt::f32, plain);
  dnnl::post_ops po;
  auto binary = [&](dnnl::algorithm alg, const dnnl::memory::desc& md, const float* data) {
    p->args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(po.len()) | DNNL_ARG_SRC_1] = dnnl::memory(md, p->eng, const_cast<float*>(data));
    po.append_binary(alg, md);
  };
  for (int i = c->bias ? 1 : 0; i < nops; ++i) {
    const ConvPostOp& q = ops[i];
    if (q.kind == ConvPostOp::kLinear) {
      if (q.a != 1.0f) {
        p->scalars.push_back(q.a);
        binary(dnnl::algorithm::binary_mul, one_md, &p->scalars.back());
      }
      if (q.b != 0.0f || q.a == 1.0f) {
        p->scalars.push_back(q.b);
        binary(dnnl::algorithm::binary_add, one_md, &p->scalars.back());
      }
    } else {
      binary(q.kind == ConvPostOp::kMulC   ? dnnl::algorithm::binary_mul
             : q.kind == ConvPostOp::kSubC ? dnnl::algorithm::binary_sub
                                           : dnnl::algorithm::binary_add,
             chan_md, q.c);
    }
  }
  c->attr.set_post_ops(po);
}

// c's primitive for input src and output dst, the weights in the layout oneDNN picks.
inline dnnl::convolution_forward::primitive_desc conv_primitive(const ConvDesc& c, const dnnl::engine& eng,
                                                                const dnnl::memory::desc& src,
                                                                const dnnl::memory::desc& dst) {
  const auto any = dnnl::memory::format_tag::any;
  const dnnl::memory::desc wei_any(c.wei, src.get_data_type(), any);
  const auto prop = dnnl::prop_kind::forward_inference;
  const auto alg = dnnl::algorithm::convolution_direct;
  if (c.bias)
    return dnnl::convolution_forward::primitive_desc(eng, prop, alg, src, wei_any, c.bias_md, dst, c.strides, c.dil, c.pad_l,
                                                     c.pad_r, c.attr);
  return dnnl::convolution_forward::primitive_desc(eng, prop, alg, src, wei_any, dst, c.strides, c.dil, c.pad_l, c.pad_r,
                                                   c.attr);
}

// The primitive for input src_md: oneDNN's direct kernel for the memory as it lies (bfloat16
// first where it applies), else the one it picks for layouts of its own.
inline dnnl::convolution_forward::primitive_desc choose_primitive(const ConvDesc& c, const ConvGeom& g,
                                                                  const dnnl::engine& eng,
                                                                  const dnnl::memory::desc& src_md,
                                                                  const dnnl::memory::desc& y_md) {
  using dt = dnnl::memory::data_type;
  const auto any = dnnl::memory::format_tag::any;
  dnnl::convolution_forward::primitive_desc pd;
  bool direct = false;
  if (g.bf16 && dnnl_bf16_kernels()) {
    // The input converted into a dense bfloat16 copy laid out as it lies (or as the
    // primitive wants it); the result float32 as it lies.
    try {
      pd = conv_primitive(c, eng, dense_desc(src_md.get_dims(), dt::bf16, g.x_cl), y_md);
      direct = !is_reference(pd);
      if (!direct) {
        pd = conv_primitive(c, eng, dnnl::memory::desc(src_md.get_dims(), dt::bf16, any), dnnl::memory::desc(y_md.get_dims(), dt::f32, any));
        direct = !is_reference(pd);
      }
    } catch (const dnnl::error&) {
      direct = false;
    }
  }
  // oneDNN's im2col kernel (gemm) on channels-last memory: what oneDNN picks for layouts
  // of its own, reorders included, is preferred unless that is its reference kernel
  // (ResNeXt's 32 groups of 4 channels on AVX2 ran faster in oneDNN's own layout:
  // bench/results/README.md).
  bool gemm_cl = false;
  if (!direct) {  // float32
    try {
      pd = conv_primitive(c, eng, src_md, y_md);
      direct = !is_reference(pd);
      gemm_cl = direct && g.x_cl && is_im2col(pd);
    } catch (const dnnl::error&) {
    }
  }
  if (!direct || gemm_cl) {
    auto own = conv_primitive(c, eng, dnnl::memory::desc(src_md.get_dims(), dt::f32, any), dnnl::memory::desc(y_md.get_dims(), dt::f32, any));
    if (!direct || !is_reference(own)) pd = own;
  }
  return pd;
}

// A candidate for a unit-stride run (unit_stride_candidate()) whose primitive *pd is no 1x1
// kernel: when oneDNN has a 1x1 kernel for the gathered pixels, *pd and *x_md become that
// primitive and its dense input, and p gathers them before each run; else nothing changes.
inline void try_unit_stride(const ConvGeom& g, int d, const Slice& s, ConvDesc c, const dnnl::memory::desc& y_md, Prim* p,
                            dnnl::convolution_forward::primitive_desc* pd, dnnl::memory::desc* x_md) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const int first = 3 - d;
  // The gathered pixels: [nn, c, rows, out...] dense channels-last, unit strides.
  dims xd = {s.nn, g.c};
  for (int i = first; i < 3; ++i) xd.push_back(i == first ? s.rows : g.out[i]);
  const dnnl::memory::desc c_md = dense_desc(xd, dt::f32, true);
  std::fill(c.strides.begin(), c.strides.end(), 1);
  std::fill(c.pad_l.begin(), c.pad_l.end(), 0);
  std::fill(c.pad_r.begin(), c.pad_r.end(), 0);
  const dnnl::convolution_forward::primitive_desc unit = choose_primitive(c, g, p->eng, c_md, y_md);
  if (!one_by_one_kernel(unit)) return;
  *pd = unit;
  *x_md = c_md;
  p->x_off = 0;
  p->geom = g;
  p->g_first = first;
  p->g_n0 = s.n0;
  p->g_nn = s.nn;
  p->g_r0 = s.r0;
  p->g_rows = s.rows;
  p->compact.assign(static_cast<size_t>(c_md.get_size() / sizeof(float)), 0.0f);
}

// The slice's primitive pd, its scratchpad, and its input (x_md, as it lies) and output
// (y_md): reordered into and out of pd's layouts where they differ, a bfloat16 input
// converted.
inline void bind_memories(const ConvGeom& g, const dnnl::convolution_forward::primitive_desc& pd,
                          const dnnl::memory::desc& x_md, const dnnl::memory::desc& y_md, Prim* p) {
  using dt = dnnl::memory::data_type;
  p->conv = dnnl::convolution_forward(pd);
  p->scratch = dnnl::memory(pd.scratchpad_desc(), p->eng);
  p->x_user = dnnl::memory(x_md, p->eng, DNNL_MEMORY_NONE);
  p->y_user = dnnl::memory(y_md, p->eng, DNNL_MEMORY_NONE);
  p->reorder_x = pd.src_desc() != x_md;
  // A channels-last slice is one dense block: converted by to_bf16 when the primitive takes it
  // as it lies (dense_desc), else reordered into the primitive's layout.
  if (pd.src_desc().get_data_type() == dt::bf16 && g.x_cl && pd.src_desc() == dense_desc(x_md.get_dims(), dt::bf16, true)) {
    p->convert_x = true;
    p->reorder_x = false;
    p->x_elems = 1;
    for (int64_t v : x_md.get_dims()) p->x_elems *= v;
  }
  p->reorder_y = pd.dst_desc() != y_md;
  p->xm = p->reorder_x || p->convert_x ? dnnl::memory(pd.src_desc(), p->eng) : p->x_user;
  p->ym = p->reorder_y ? dnnl::memory(pd.dst_desc(), p->eng) : p->y_user;
  if (p->reorder_x) p->rx = dnnl::reorder(p->x_user, p->xm);
  if (p->reorder_y) p->ry = dnnl::reorder(p->ym, p->y_user);
}

// The weights w (dims wei) in pd's layout: share's copy when it has that layout (constant
// weights), else reordered once into a copy of p's own.
inline void bind_weights(const dnnl::convolution_forward::primitive_desc& pd, int d, bool grouped,
                         const dnnl::memory::dims& wei, const float* w, const Prim* share, Prim* p) {
  // Weights [Cout, C/groups, k...] (or [groups, Cout/g, C/g, k...]), all of them per slice.
  p->w_user = dnnl::memory({wei, dnnl::memory::data_type::f32, plain_weights(d, grouped)}, p->eng, const_cast<float*>(w));
  if (share && share->wm->get_desc() == pd.weights_desc()) {
    p->wm = share->wm;
    return;
  }
  p->wm = std::make_shared<dnnl::memory>(pd.weights_desc(), p->eng);
  p->rw = dnnl::reorder(p->w_user, *p->wm);
  p->rw.execute(p->st, p->w_user, *p->wm);
  p->st.wait();
}

// g is normalised to 3 spatial dims with leading unit dims; d is the real spatial rank. The
// calling thread's OpenMP count must be 1: oneDNN fixes the work split when it creates the
// primitive. `share`: an earlier slice whose reordered weights this one reuses when it wants
// the same layout (constant weights only). ops: the post-ops (ConvPostOp), applied by oneDNN.
inline std::unique_ptr<Prim> make(const ConvGeom& g, int d, const Slice& s, const float* w, const Prim* share,
                                  const ConvPostOp* ops, int nops) {
  using dims = dnnl::memory::dims;
  auto p = std::make_unique<Prim>();
  const int first = 3 - d;
  const int64_t cin_g = g.c / g.groups, cout_g = g.cout / g.groups;
  ConvDesc c;
  int64_t in_r0 = 0, in_r1 = 0;
  slice_geometry(g, d, s, &c, &in_r0, &in_r1);
  dnnl::memory::desc x_md = block_desc(g.n, g.c, g.in, d, g.x_cl, s.n0, s.nn, in_r0, in_r1 - in_r0 + 1, &p->x_off);
  const dnnl::memory::desc y_md = block_desc(g.n, g.cout, g.out, d, g.y_cl, s.n0, s.nn, s.r0, s.rows, &p->y_off);
  const bool grouped = g.groups > 1;
  c.wei = grouped ? dims{g.groups, cout_g, cin_g} : dims{g.cout, g.c};
  for (int i = first; i < 3; ++i) c.wei.push_back(g.k[i]);
  add_post_ops(g, d, ops, nops, p.get(), &c);
  p->y_elems = s.nn * g.cout * s.rows;
  for (int i = first + 1; i < 3; ++i) p->y_elems *= g.out[i];
  dnnl::convolution_forward::primitive_desc pd = choose_primitive(c, g, p->eng, x_md, y_md);
  if (unit_stride_candidate(g) && !one_by_one_kernel(pd)) try_unit_stride(g, d, s, c, y_md, p.get(), &pd, &x_md);
  bind_memories(g, pd, x_md, y_md, p.get());
  bind_weights(pd, d, grouped, c.wei, w, share, p.get());
  return p;
}

// The slices of g for `threads` threads: one when the convolution is small; ranges of images
// when there are at least as many as slices wanted; else each image's output rows in ranges.
// `blocks`: the convolution's result is read again right after each slice is stored (an
// epilogue), or its input converted first (bfloat16): then slices are also cut small enough
// (kBlockBytes of result) for that to happen while the block is still in cache, even on
// one thread; they run one after another on each thread.
inline std::vector<Slice> slices(const ConvGeom& g, int d, int threads, bool blocks) {
  const int first = 3 - d;
  const int64_t cin_g = g.c / g.groups;
  const int64_t macs = g.n * g.cout * g.out[0] * g.out[1] * g.out[2] * cin_g * g.k[0] * g.k[1] * g.k[2];
  const int64_t rows = g.out[first];
  const int64_t out_bytes = 4 * g.n * g.cout * g.out[0] * g.out[1] * g.out[2];
  const int64_t by_size = blocks ? (out_bytes + kBlockBytes - 1) / kBlockBytes : 1;
  const int64_t want = std::max<int64_t>(threads, by_size);
  if (want <= 1 || macs < kSplitMacs || g.n < 1) return {Slice{0, g.n, 0, rows}};
  std::vector<Slice> out;
  if (g.n >= want) {
    for (int64_t t = 0; t < want; ++t) {
      const int64_t b = g.n * t / want, e = g.n * (t + 1) / want;
      if (e > b) out.push_back(Slice{b, e - b, 0, rows});
    }
    return out;
  }
  const int64_t parts = std::min<int64_t>((want + g.n - 1) / g.n, rows);
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t t = 0; t < parts; ++t) {
      const int64_t b = rows * t / parts, e = rows * (t + 1) / parts;
      // A range whose every input row lies in the padding (possible only when the padding
      // is at least a whole stride of rows): keep the convolution whole.
      const int64_t top = b * g.stride[first] - g.pad[first];
      const int64_t bottom = (e - 1) * g.stride[first] - g.pad[first] + (g.k[first] - 1) * g.dil[first];
      if (bottom < 0 || top > g.in[first] - 1) return {Slice{0, g.n, 0, rows}};
      if (e > b) out.push_back(Slice{n, 1, b, e - b});
    }
  }
  return out;
}

inline void run(Prim& p, const float* x, const float* w, float* y, bool reorder_w, const ConvEpilogue* epi) {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  if (reorder_w) {
    p.w_user.set_data_handle(const_cast<float*>(w));
    p.rw.execute(p.st, p.w_user, *p.wm);
  }
  if (!p.compact.empty()) {
    gather_pixels(p.geom, p.g_first, x, p.compact.data(), p.g_n0, p.g_nn, p.g_r0, p.g_rows);
    x = p.compact.data();
  }
  p.x_user.set_data_handle(const_cast<float*>(x) + p.x_off);
  p.y_user.set_data_handle(y + p.y_off);
  if (p.reorder_x) p.rx.execute(p.st, p.x_user, p.xm);
  if (p.convert_x) to_bf16(x + p.x_off, static_cast<uint16_t*>(p.xm.get_data_handle()), p.x_elems);
  std::unordered_map<int, dnnl::memory> args = p.args;
  args[DNNL_ARG_SRC] = p.xm;
  args[DNNL_ARG_WEIGHTS] = *p.wm;
  args[DNNL_ARG_DST] = p.ym;
  args[DNNL_ARG_SCRATCHPAD] = p.scratch;
  p.conv.execute(p.st, args);
  if (p.reorder_y) p.ry.execute(p.st, p.ym, p.y_user);
  p.st.wait();
  if (epi) epi->fn(epi->ctx, y, p.y_off, p.y_elems);
}

// [n, c, plane] <-> [n, plane, c] (channels-last), for conv.h's NC(D)HW-only kernels.
inline void transpose_planes(const float* src, float* dst, int64_t n, int64_t rows, int64_t cols) {
  for (int64_t b = 0; b < n; ++b) {
    const float* s = src + b * rows * cols;
    float* t = dst + b * rows * cols;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = s[r * cols + c];
  }
}

}  // namespace dnnl_detail

struct DnnlCache {
  std::mutex m;
  // By (weights, threads): the slices and their primitives depend on both.
  std::map<std::pair<const float*, int>, std::vector<std::unique_ptr<dnnl_detail::Prim>>> by_weights;
  bool refused = false;  // oneDNN could not build this convolution: conv.h runs it
};

// The post-ops on a stored result, NC(D)HW (for conv_fallback).
inline void apply_post_ops(const ConvGeom& g, float* y, const ConvPostOp* ops, int nops) {
  const int64_t plane = g.out[0] * g.out[1] * g.out[2];
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t c = 0; c < g.cout; ++c) {
      float* row = y + (n * g.cout + c) * plane;
      for (int i = 0; i < nops; ++i) {
        const ConvPostOp& q = ops[i];
        for (int64_t j = 0; j < plane; ++j) {
          float& v = row[j];
          switch (q.kind) {
            case ConvPostOp::kBias:
            case ConvPostOp::kAddC: v = v + q.c[c]; break;
            case ConvPostOp::kMulC: v = v * q.c[c]; break;
            case ConvPostOp::kSubC: v = v - q.c[c]; break;
            case ConvPostOp::kLinear: v = q.a * v + q.b; break;
            default: break;
          }
        }
      }
    }
  }
}

// conv.h's kernel on channels-last memory: the input and the result are transposed around
// it, the post-ops applied after it (only for a geometry oneDNN refuses).
template <class Gemm>
void conv_fallback(const ConvGeom& g, const float* x, const float* w, float* y, const ConvPostOp* ops, int nops,
                   const ConvEpilogue* epi, rt::ThreadPool* pool, Gemm&& gemm) {
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  std::vector<float> xt, yt;
  const float* xs = x;
  if (g.x_cl) {
    xt.resize(static_cast<size_t>(g.n * g.c * in_plane));
    dnnl_detail::transpose_planes(x, xt.data(), g.n, in_plane, g.c);
    xs = xt.data();
  }
  if (g.y_cl) yt.resize(static_cast<size_t>(g.n * g.cout * out_plane));
  conv<float>(g, xs, w, g.y_cl ? yt.data() : y, pool, gemm);
  apply_post_ops(g, g.y_cl ? yt.data() : y, ops, nops);
  if (g.y_cl) dnnl_detail::transpose_planes(yt.data(), y, g.n, g.cout, out_plane);
  if (epi) epi->fn(epi->ctx, y, 0, g.n * g.cout * out_plane);
}

// const_weights: w is a constant of the program (reordered once per program); otherwise it
// may change between calls and is reordered on every call.
template <class Gemm>
void conv_dnnl(DnnlCache& cache, const ConvGeom& g, int d, const float* x, const float* w, float* y, bool const_weights,
               const ConvPostOp* ops, int nops, const ConvEpilogue* epi, rt::ThreadPool* pool, Gemm&& gemm) {
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
          for (const dnnl_detail::Slice& s : dnnl_detail::slices(g, d, threads, epi != nullptr || g.bf16)) {
            made.push_back(
                dnnl_detail::make(g, d, s, w, const_weights && !made.empty() ? made.front().get() : nullptr, ops, nops));
          }
          it = cache.by_weights.emplace(key, std::move(made)).first;
        } catch (const dnnl::error&) {
          cache.refused = true;
        }
      }
      if (!cache.refused) parts = &it->second;
    }
  }
  if (!parts) {
    conv_fallback(g, x, w, y, ops, nops, epi, pool, gemm);
    return;
  }
  const bool reorder_w = !const_weights && !fresh;
  if (parts->size() == 1 || threads <= 1) {
    for (auto& part : *parts) dnnl_detail::run(*part, x, w, y, reorder_w, epi);
    return;
  }
  pool->parallel_for(static_cast<int64_t>(parts->size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dnnl_detail::run(*(*parts)[static_cast<size_t>(i)], x, w, y, reorder_w, epi);
  });
}

}  // namespace chroma::et

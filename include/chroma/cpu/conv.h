// chroma::et::conv: the runtime kernel behind the IR's Conv primitive.
//
// y = conv(x, w): x [N, C, in...], w [Cout, C/groups, k...], y [N, Cout, out...], all dense
// and contiguous, 1 to 3 spatial dims (normalised here to 3 with leading unit dims), zero
// padding, no bias (bias and activations are elementwise consumers the fuser handles).
//
// Unlike the expression templates in et.h, these loops take their sizes at run time: one
// instantiation per element type serves every convolution of a model, so a network with
// dozens of convolutions compiles in seconds.
//
// Three forms:
//  * depthwise (one input channel per group): each output row accumulates K shifted input
//    rows scaled by one weight; the valid range of each shift is computed once, so the inner
//    loop has no bounds checks and vectorises (unit stride) or runs strided;
//  * pointwise (1x1, stride 1, no padding): one GEMM per image and group, on x directly;
//  * general: im2col in blocks of output pixels into a per-thread scratch of at most
//    kScratchBytes (sized to stay in L2), each block followed by its GEMM, which writes the
//    block's columns of y. No full im2col buffer is ever formed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "chroma/cpu/threads.h"

namespace chroma::et {

struct ConvGeom {
  int64_t n, c, cout, groups;
  int64_t in[3], out[3], k[3], stride[3], pad[3], dil[3];
  // x and y stored channels-last ([N, spatial..., C] in memory); conv() itself reads and
  // writes NC(D)HW only, conv_dnnl (conv_dnnl.h) either.
  bool x_cl = false, y_cl = false;
  // The input and the weights hold bfloat16 values (a bfloat16 model, widened): conv_dnnl
  // runs oneDNN's bfloat16 kernel on them (exact conversions, float32 accumulation and
  // result), where the CPU has bfloat16 dot products; everything else ignores it.
  bool bf16 = false;
};

// Arithmetic applied to a convolution's result before it is stored, in order (conv_dnnl:
// oneDNN's bias and binary post-ops). kBias (first only) and kAddC add c[channel], kMulC
// multiplies by it, kSubC subtracts it; kLinear: a * y + b.
struct ConvPostOp {
  enum Kind : int { kBias, kLinear, kAddC, kMulC, kSubC };
  int kind;
  float a, b;
  const float* c;
};

// An elementwise function applied in place to whole pixels [i0, i0 + n) (elements) of a
// channels-last result once they are stored (generated per convolution:
// src/codegen/cpu/emit_conv.cpp).
struct ConvEpilogue {
  void (*fn)(const void* ctx, float* y, int64_t i0, int64_t n);
  const void* ctx;
};

// The loop of a generated epilogue: y[p + c] = f(y[p + c], p, c) over the pixels p of
// [i0, i0 + n) (C channels each). With GCC its vectors are 512 bits wide where the CPU has
// AVX-512 (GCC's default for -march=native there is 256): an epilogue is a long chain of
// arithmetic on each element of a block that is still in cache, and a bfloat16 model's
// roundings make it longer (the figure: bench/results/README.md).
#if defined(__GNUC__) && !defined(__clang__)
#define CHROMA_WIDE_VECTORS [[gnu::target("prefer-vector-width=512"), gnu::noinline]]
#else
#define CHROMA_WIDE_VECTORS
#endif
template <int64_t C, class F>
CHROMA_WIDE_VECTORS inline void epilogue_pixels(float* y, int64_t i0, int64_t n, const F& f) {
  for (int64_t p = i0; p < i0 + n; p += C) {
#pragma GCC ivdep
    for (int64_t c = 0; c < C; ++c) y[p + c] = f(y[p + c], p, c);
  }
}

inline constexpr int64_t kConvScratchBytes = 512 * 1024;

namespace conv_detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// Output positions o in [0, out) with 0 <= o * s + off < in: [*lo, *hi).
inline void valid_range(int64_t out, int64_t in, int64_t s, int64_t off, int64_t* lo, int64_t* hi) {
  *lo = std::clamp<int64_t>(ceil_div(-off, s), 0, out);
  *hi = std::clamp<int64_t>(ceil_div(in - off, s), *lo, out);
}

template <class T>
void depthwise(const ConvGeom& g, const T* x, const T* w, T* y, rt::ThreadPool* pool) {
  const int64_t mult = g.cout / g.c;
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  const int64_t kk = g.k[0] * g.k[1] * g.k[2];
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t job = b; job < e; ++job) {
      const int64_t n = job / g.cout, co = job % g.cout, c = co / mult;
      const T* xc = x + (n * g.c + c) * in_plane;
      const T* wc = w + co * kk;
      T* yc = y + job * out_plane;
      for (int64_t od = 0; od < g.out[0]; ++od) {
        for (int64_t oh = 0; oh < g.out[1]; ++oh) {
          T* row = yc + (od * g.out[1] + oh) * g.out[2];
          for (int64_t ow = 0; ow < g.out[2]; ++ow) row[ow] = T(0);
          for (int64_t kd = 0; kd < g.k[0]; ++kd) {
            const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
            if (id < 0 || id >= g.in[0]) continue;
            for (int64_t kh = 0; kh < g.k[1]; ++kh) {
              const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
              if (ih < 0 || ih >= g.in[1]) continue;
              const T* xr = xc + (id * g.in[1] + ih) * g.in[2];
              for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                const T wv = wc[(kd * g.k[1] + kh) * g.k[2] + kw];
                const int64_t off = kw * g.dil[2] - g.pad[2];
                int64_t lo, hi;
                valid_range(g.out[2], g.in[2], g.stride[2], off, &lo, &hi);
                if (g.stride[2] == 1) {
                  const T* xs = xr + off;
                  for (int64_t ow = lo; ow < hi; ++ow) row[ow] += wv * xs[ow];
                } else {
                  const int64_t s = g.stride[2];
                  for (int64_t ow = lo; ow < hi; ++ow) row[ow] += wv * xr[ow * s + off];
                }
              }
            }
          }
        }
      }
    }
  };
  const int64_t jobs = g.n * g.cout;
  if (pool && pool->size() > 1 && jobs > 1) {
    pool->parallel_for(jobs, body);
  } else {
    body(0, jobs);
  }
}

// Rows [r0, r0 + rows) x output pixels [p0, p0 + np) of the im2col matrix of image n, group
// grp: row r = (ci * K + kidx) holds x[ci, in-coordinates of (pixel, kidx)] or 0 in padding.
template <class T>
void im2col_block(const ConvGeom& g, const T* xg, int64_t p0, int64_t np, T* col) {
  const int64_t cin_g = g.c / g.groups;
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2];
  const int64_t hw = g.out[1] * g.out[2];
  int64_t r = 0;
  for (int64_t ci = 0; ci < cin_g; ++ci) {
    const T* xc = xg + ci * in_plane;
    for (int64_t kd = 0; kd < g.k[0]; ++kd) {
      for (int64_t kh = 0; kh < g.k[1]; ++kh) {
        for (int64_t kw = 0; kw < g.k[2]; ++kw, ++r) {
          T* dst = col + r * np;
          const int64_t offw = kw * g.dil[2] - g.pad[2];
          int64_t lo, hi;
          valid_range(g.out[2], g.in[2], g.stride[2], offw, &lo, &hi);
          // Walk the block row by row of the output plane.
          int64_t p = p0;
          const int64_t pe = p0 + np;
          while (p < pe) {
            const int64_t od = p / hw, rem = p % hw, oh = rem / g.out[2], ow0 = rem % g.out[2];
            const int64_t ow1 = std::min<int64_t>(g.out[2], ow0 + (pe - p));
            T* d = dst + (p - p0);
            const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
            const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
            if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
              for (int64_t ow = ow0; ow < ow1; ++ow) d[ow - ow0] = T(0);
            } else {
              const T* xr = xc + (id * g.in[1] + ih) * g.in[2];
              const int64_t a = std::clamp(lo, ow0, ow1), b = std::clamp(hi, ow0, ow1);
              for (int64_t ow = ow0; ow < a; ++ow) d[ow - ow0] = T(0);
              if (g.stride[2] == 1) {
                if (b > a) std::memcpy(d + (a - ow0), xr + a + offw, static_cast<size_t>(b - a) * sizeof(T));
              } else {
                const int64_t s = g.stride[2];
                for (int64_t ow = a; ow < b; ++ow) d[ow - ow0] = xr[ow * s + offw];
              }
              for (int64_t ow = b; ow < ow1; ++ow) d[ow - ow0] = T(0);
            }
            p += ow1 - ow0;
          }
        }
      }
    }
  }
}

}  // namespace conv_detail

// gemm(m, n, k, A, lda, B, ldb, C, ldc): C = A @ B, row-major, no transposes.
template <class T, class Gemm>
void conv(const ConvGeom& g, const T* x, const T* w, T* y, rt::ThreadPool* pool, Gemm&& gemm) {
  const int64_t cin_g = g.c / g.groups, cout_g = g.cout / g.groups;
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  const int64_t kk = g.k[0] * g.k[1] * g.k[2];
  if (cin_g == 1 && g.groups == g.c && g.groups > 1) {
    conv_detail::depthwise(g, x, w, y, pool);
    return;
  }
  const bool pointwise = kk == 1 && g.stride[0] == 1 && g.stride[1] == 1 && g.stride[2] == 1 && g.pad[0] == 0 &&
                         g.pad[1] == 0 && g.pad[2] == 0;
  const int64_t ck = cin_g * kk;
  if (pointwise) {
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        gemm(cout_g, out_plane, cin_g, w + grp * cout_g * cin_g, cin_g, x + (n * g.c + grp * cin_g) * in_plane, in_plane,
             y + (n * g.cout + grp * cout_g) * out_plane, out_plane);
      }
    }
    return;
  }
  // Block of output pixels: a multiple of 16 columns with ck * block * sizeof(T) within the
  // scratch budget (at least 16 columns).
  int64_t block = kConvScratchBytes / static_cast<int64_t>(sizeof(T)) / std::max<int64_t>(ck, 1);
  block = std::max<int64_t>(16, block / 16 * 16);
  block = std::min(block, out_plane);
  thread_local std::vector<T> scratch;
  if (scratch.size() < static_cast<size_t>(ck * block)) scratch.resize(static_cast<size_t>(ck * block));
  T* col = scratch.data();
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const T* xg = x + (n * g.c + grp * cin_g) * in_plane;
      const T* wg = w + grp * cout_g * ck;
      T* yg = y + (n * g.cout + grp * cout_g) * out_plane;
      for (int64_t p0 = 0; p0 < out_plane; p0 += block) {
        const int64_t np = std::min(block, out_plane - p0);
        conv_detail::im2col_block(g, xg, p0, np, col);
        gemm(cout_g, np, ck, wg, ck, col, np, yg + p0, out_plane);
      }
    }
  }
}

}  // namespace chroma::et

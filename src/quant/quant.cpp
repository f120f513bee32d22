#include "quant/quant.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "chroma/half.h"
#include "ir/graph.h"

namespace chroma::quant {

const char* format_name(Format f) {
  switch (f) {
    case Format::kF32: return "fp32";
    case Format::kBF16: return "bf16";
    case Format::kQ8: return "q8";
    case Format::kQ6: return "q6";
    case Format::kQ4: return "q4";
  }
  return "?";
}

const char* activations_name(Activations a) {
  switch (a) {
    case Activations::kAuto: return "auto";
    case Activations::kBF16: return "bf16";
    case Activations::kFP32: return "fp32";
  }
  return "?";
}

std::optional<Format> parse_format(std::string_view s) {
  for (Format f : {Format::kF32, Format::kBF16, Format::kQ8, Format::kQ6, Format::kQ4}) {
    if (s == format_name(f)) return f;
  }
  return std::nullopt;
}

int format_bits(Format f) {
  switch (f) {
    case Format::kF32: return 32;
    case Format::kBF16: return 16;
    case Format::kQ8: return 8;
    case Format::kQ6: return 6;
    case Format::kQ4: return 4;
  }
  return 32;
}

double bits_per_weight(Format f) {
  const int b = format_bits(f);
  return b >= 16 ? b : b + 32.0 / kGroup;
}

namespace {

bool is_q(Format f) { return f == Format::kQ8 || f == Format::kQ6 || f == Format::kQ4; }

uint16_t f16_bits(float x) { return half_detail::f32_to_f16(x); }
float f16_value(uint16_t b) { return half_detail::f16_to_f32(b); }

}  // namespace

bool quantize_group(const float* w, int64_t n, int64_t stride, int bits, uint8_t* q, uint16_t* scale_out,
                    uint16_t* bias_out) {
  // MLX's affine_quantize, in float32: the scale spans [min, max] in 2^bits - 1 steps; the
  // edge of larger magnitude is made exactly representable (q0 steps from zero), so that
  // zero itself dequantizes to exactly zero.
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  float w_min = std::numeric_limits<float>::infinity(), w_max = -w_min;
  for (int64_t i = 0; i < n; ++i) {
    const float v = w[i * stride];
    if (!std::isfinite(v)) return false;  // NaN or infinity: not representable
    w_max = std::max(w_max, v);
    w_min = std::min(w_min, v);
  }
  const bool mask = std::abs(w_min) > std::abs(w_max);
  float scale = std::max((w_max - w_min) / n_bins, eps);
  scale = mask ? scale : -scale;
  const float edge = mask ? w_min : w_max;
  const float q0 = std::rint(edge / scale);
  float bias = 0;
  if (q0 != 0) {
    scale = edge / q0;
    bias = edge;
  }
  // Stored in float16; q is rounded again with the values the kernels will use.
  const uint16_t sb = f16_bits(scale), bb = f16_bits(bias);
  const float s = f16_value(sb), b = f16_value(bb);
  if (!std::isfinite(s) || !std::isfinite(b) || s == 0.0f || !std::isfinite(w_min) || !std::isfinite(w_max)) return false;
  for (int64_t i = 0; i < n; ++i) {
    float v = std::rint((w[i * stride] - b) / s);
    v = std::min(std::max(v, 0.0f), n_bins);
    q[i] = static_cast<uint8_t>(v);
  }
  *scale_out = sb;
  *bias_out = bb;
  return true;
}

Quantized quantize_matrix(const float* w, int64_t rows, int64_t k, int64_t row_stride, int64_t k_stride, int bits) {
  Quantized r;
  r.rows = rows;
  r.k = k;
  const int64_t groups = (k + kGroup - 1) / kGroup;
  r.q.assign(static_cast<size_t>(rows * k), 0);
  r.scales.assign(static_cast<size_t>(rows * groups), 0);
  r.biases.assign(static_cast<size_t>(rows * groups), 0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * kGroup, n = std::min(kGroup, k - k0);
      const size_t gi = static_cast<size_t>(i * groups + g);
      r.ok = quantize_group(w + i * row_stride + k0 * k_stride, n, k_stride, bits, &r.q[static_cast<size_t>(i * k + k0)],
                            &r.scales[gi], &r.biases[gi]) &&
             r.ok;
    }
  }
  return r;
}

int64_t group_rows_padded(int64_t K, int64_t g) { return (std::min(kGroup, K - g * kGroup) + 3) / 4 * 4; }

namespace {

int64_t group_bytes(Format f, int64_t rows) {
  switch (f) {
    case Format::kBF16: return rows * kPanel * 2;
    case Format::kQ8: return 64 + rows * kPanel;
    case Format::kQ6: return 64 + rows / 4 * 48;
    case Format::kQ4: return 64 + rows * kPanel / 2;
    case Format::kF32: return rows * kPanel * 4;
  }
  return 0;
}

}  // namespace

int64_t panel_bytes(Format f, int64_t K) {
  int64_t bytes = 0;
  for (int64_t g = 0; g * kGroup < K; ++g) bytes += group_bytes(f, group_rows_padded(K, g));
  return bytes;
}

bool pack(Format f, const float* b, int64_t K, int64_t N, int64_t sk, int64_t sn, uint8_t* dst) {
  const int64_t P = panels_of(N), groups = (K + kGroup - 1) / kGroup;
  const int bits = format_bits(f);
  std::memset(dst, 0, static_cast<size_t>(matrix_bytes(f, K, N)));
  uint8_t* out = dst;
  uint8_t q[kPanel][kGroup];
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * kGroup, kg = std::min(kGroup, K - k0), rows = group_rows_padded(K, g);
      std::memset(q, 0, sizeof q);
      if (is_q(f)) {
        auto* sc = reinterpret_cast<uint16_t*>(out);
        for (int64_t j = 0; j < kPanel && p * kPanel + j < N; ++j) {
          uint16_t s = 0, bb = 0;
          if (!quantize_group(b + k0 * sk + (p * kPanel + j) * sn, kg, sk, bits, q[j], &s, &bb)) return false;
          std::memcpy(sc + j, &s, 2);
          std::memcpy(sc + kPanel + j, &bb, 2);
        }
        out += 64;
      }
      auto qv = [&](int64_t r, int64_t j) -> uint32_t { return r < kg ? q[j][r] : 0u; };
      switch (f) {
        case Format::kBF16:
          for (int64_t r = 0; r < rows; r += 2) {
            for (int64_t w = 0; w < 32; ++w) {
              const int64_t t = w & 1, j = w >> 1, k = r + t, col = p * kPanel + j;
              const uint16_t v = k < kg && col < N ? half_detail::f32_to_bf16(b[(k0 + k) * sk + col * sn]) : 0;
              std::memcpy(out + w * 2, &v, 2);
            }
            out += 64;
          }
          break;
        case Format::kQ8:
          for (int64_t r = 0; r < rows; r += 2) {
            for (int64_t w = 0; w < 32; ++w) out[w] = static_cast<uint8_t>(qv(r + (w & 1), w >> 1));
            out += 32;
          }
          break;
        case Format::kQ4:
        case Format::kQ6:
          for (int64_t r = 0; r < rows; r += 4) {
            for (int64_t w = 0; w < 32; ++w) {
              const int64_t t = w & 1, j = w >> 1;
              out[w] = static_cast<uint8_t>((qv(r + t, j) & 15u) | (qv(r + 2 + t, j) & 15u) << 4);
            }
            out += 32;
            if (f == Format::kQ6) {
              auto hi = [&](int64_t w, int64_t row) { return (qv(r + row + (w & 1), w >> 1) >> 4) & 3u; };
              for (int64_t i = 0; i < 16; ++i) {
                out[i] = static_cast<uint8_t>(hi(i, 0) | hi(i, 2) << 2 | hi(i + 16, 0) << 4 | hi(i + 16, 2) << 6);
              }
              out += 16;
            }
          }
          break;
        case Format::kF32:
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < kPanel; ++j) {
              const int64_t col = p * kPanel + j;
              const float v = r < kg && col < N ? b[(k0 + r) * sk + col * sn] : 0.0f;
              std::memcpy(out + j * 4, &v, 4);
            }
            out += 64;
          }
          break;
      }
    }
  }
  return true;
}

std::vector<float> unpack(Format f, const uint8_t* src, int64_t K, int64_t N) {
  std::vector<float> w(static_cast<size_t>(K * N), 0.0f);
  const int64_t P = panels_of(N), groups = (K + kGroup - 1) / kGroup;
  const uint8_t* in = src;
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * kGroup, kg = std::min(kGroup, K - k0), rows = group_rows_padded(K, g);
      float s[kPanel], bb[kPanel];
      if (is_q(f)) {
        for (int64_t j = 0; j < kPanel; ++j) {
          uint16_t a, c;
          std::memcpy(&a, in + 2 * j, 2);
          std::memcpy(&c, in + 32 + 2 * j, 2);
          s[j] = f16_value(a);
          bb[j] = f16_value(c);
        }
        in += 64;
      }
      auto put = [&](int64_t r, int64_t j, float v) {
        const int64_t col = p * kPanel + j;
        if (r < kg && col < N) w[static_cast<size_t>((k0 + r) * N + col)] = v;
      };
      auto deq = [&](int64_t r, int64_t j, uint32_t q) { put(r, j, s[j] * static_cast<float>(q) + bb[j]); };
      switch (f) {
        case Format::kBF16:
          for (int64_t r = 0; r < rows; r += 2, in += 64) {
            for (int64_t w2 = 0; w2 < 32; ++w2) {
              uint16_t v;
              std::memcpy(&v, in + 2 * w2, 2);
              put(r + (w2 & 1), w2 >> 1, half_detail::bf16_to_f32(v));
            }
          }
          break;
        case Format::kQ8:
          for (int64_t r = 0; r < rows; r += 2, in += 32) {
            for (int64_t w2 = 0; w2 < 32; ++w2) deq(r + (w2 & 1), w2 >> 1, in[w2]);
          }
          break;
        case Format::kQ4:
        case Format::kQ6:
          for (int64_t r = 0; r < rows; r += 4) {
            const uint8_t* lo = in;
            const uint8_t* hi = f == Format::kQ6 ? in + 32 : nullptr;
            for (int64_t w2 = 0; w2 < 32; ++w2) {
              uint32_t a = lo[w2] & 15u, c = lo[w2] >> 4;
              if (hi) {
                const uint32_t h = (hi[w2 & 15] >> (w2 >= 16 ? 4 : 0)) & 15u;
                a |= (h & 3u) << 4;
                c |= (h >> 2) << 4;
              }
              deq(r + (w2 & 1), w2 >> 1, a);
              deq(r + 2 + (w2 & 1), w2 >> 1, c);
            }
            in += hi ? 48 : 32;
          }
          break;
        case Format::kF32:
          for (int64_t r = 0; r < rows; ++r, in += 64) {
            for (int64_t j = 0; j < kPanel; ++j) {
              float v;
              std::memcpy(&v, in + 4 * j, 4);
              put(r, j, v);
            }
          }
          break;
      }
    }
  }
  return w;
}

namespace {

int64_t row_group_bytes(Format f, int64_t n) {
  switch (f) {
    case Format::kBF16: return 2 * n;
    case Format::kQ8: return 4 + n;
    case Format::kQ6: return 4 + (n * 6 + 7) / 8;
    case Format::kQ4: return 4 + (n + 1) / 2;
    case Format::kF32: return 4 * n;
  }
  return 0;
}

}  // namespace

int64_t row_bytes(Format f, int64_t H) {
  int64_t b = 0;
  for (int64_t k0 = 0; k0 < H; k0 += kGroup) b += row_group_bytes(f, std::min(kGroup, H - k0));
  return b;
}

bool pack_rows(Format f, const float* t, int64_t rows, int64_t H, uint8_t* dst) {
  const int bits = format_bits(f);
  const int64_t rb = row_bytes(f, H);
  std::memset(dst, 0, static_cast<size_t>(rows * rb));
  uint8_t q[kGroup];
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* out = dst + r * rb;
    for (int64_t k0 = 0; k0 < H; k0 += kGroup) {
      const int64_t n = std::min(kGroup, H - k0);
      const float* w = t + r * H + k0;
      if (f == Format::kBF16) {
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t v = half_detail::f32_to_bf16(w[i]);
          std::memcpy(out + 2 * i, &v, 2);
        }
      } else if (f != Format::kF32) {
        uint16_t s = 0, b = 0;
        if (!quantize_group(w, n, 1, bits, q, &s, &b)) return false;
        std::memcpy(out, &s, 2);
        std::memcpy(out + 2, &b, 2);
        uint8_t* v = out + 4;
        for (int64_t i = 0; i < n; ++i) {  // little-endian bit packing
          const int64_t bit = i * bits;
          const uint32_t x = static_cast<uint32_t>(q[i]) << (bit % 8);
          v[bit / 8] = static_cast<uint8_t>(v[bit / 8] | (x & 0xffu));
          if ((bit % 8) + bits > 8) v[bit / 8 + 1] = static_cast<uint8_t>(v[bit / 8 + 1] | (x >> 8));
        }
      }
      out += row_group_bytes(f, n);
    }
  }
  return true;
}

// ---- policy ----------------------------------------------------------------------------------

bool Policy::quantizes() const {
  if (fallback != Format::kF32) return true;
  return std::any_of(rules.begin(), rules.end(), [](const Rule& r) { return r.format != Format::kF32; });
}

Policy parse_policy(const std::string& spec) {
  Policy p;
  p.spec = spec;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(';', pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.rfind('=');
    // A bare format is the default.
    const std::string key = eq == std::string::npos ? "default" : item.substr(0, eq);
    const std::string value = eq == std::string::npos ? item : item.substr(eq + 1);
    if (key == "activations") {
      if (value == "auto") {
        p.activations = Activations::kAuto;
      } else if (value == "bf16") {
        p.activations = Activations::kBF16;
      } else if (value == "fp32") {
        p.activations = Activations::kFP32;
      } else {
        throw CompileError("weights: activations must be 'auto', 'bf16' or 'fp32', not '" + value + "'");
      }
      continue;
    }
    if (key == "attention") {
      if (value != "bf16" && value != "fp32") {
        throw CompileError("weights: attention must be 'bf16' or 'fp32', not '" + value + "'");
      }
      p.attention_bf16 = value == "bf16";
      continue;
    }
    const std::optional<Format> f = parse_format(value);
    if (!f) throw CompileError("weights: unknown format '" + value + "' for '" + key + "' (fp32, bf16, q8, q6, q4)");
    if (key.empty()) throw CompileError("weights: empty pattern in '" + item + "'");
    if (key == "default") {
      p.fallback = *f;
    } else {
      p.rules.push_back({key, *f});
    }
  }
  return p;
}

namespace {

// The keep-list (llama.cpp's llama-quant.cpp, mlx-lm's quant_predicate): routers and gates of
// mixtures of experts, norms, biases and attention sinks stay exact, and so do matrices too
// small to matter.
std::string kept_because(const std::string& name, int64_t weights) {
  std::vector<std::string> parts;
  for (size_t a = 0; a <= name.size();) {
    size_t b = name.find('.', a);
    if (b == std::string::npos) b = name.size();
    parts.push_back(name.substr(a, b - a));
    a = b + 1;
  }
  if (!parts.empty() && (parts.back() == "weight" || parts.back() == "T")) parts.pop_back();
  for (const std::string& s : parts) {
    std::string l = s;
    std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (l.find("router") != std::string::npos) return "kept: router";
    if (l.find("norm") != std::string::npos) return "kept: norm";
    if (l.find("sink") != std::string::npos) return "kept: sink";
    if (l == "bias" || l.ends_with("_bias")) return "kept: bias";
  }
  if (!parts.empty()) {
    std::string l = parts.back();
    std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (l == "gate" || l == "gating" || l == "gate_inp") return "kept: router/gate";
  }
  if (weights < 4096) return "kept: small (under 4096 weights)";
  return "";
}

}  // namespace

Decision decide(const Policy& p, const std::string& name, const std::string& role, int64_t K, int64_t N, int64_t matrices) {
  Decision d;
  d.name = name;
  d.role = role;
  d.shape = {K, N};
  d.matrices = matrices;
  d.bytes_f32 = K * N * matrices * 4;
  d.format = Format::kF32;
  d.reason = "default";
  bool chosen = false;
  for (const Rule& r : p.rules) {
    if ((!role.empty() && r.pattern == role) || fnmatch(r.pattern.c_str(), name.c_str(), 0) == 0) {
      d.format = r.format;
      d.reason = "rule " + r.pattern;
      chosen = true;
      break;
    }
  }
  if (!chosen) {
    if (std::string k = kept_because(name, K * N * matrices); !k.empty() && p.fallback != Format::kF32) {
      d.reason = k;
    } else {
      d.format = p.fallback;
    }
  }
  // An embedding is stored in the row layout (N rows of K), a product's operand in panels.
  d.bytes = d.format == Format::kF32 ? d.bytes_f32
            : role == "embedding"    ? N * row_bytes(d.format, K) * matrices
                                     : matrix_bytes(d.format, K, N) * matrices;
  return d;
}

}  // namespace chroma::quant

// Weight quantization (docs/quantization.md): MLX's affine group quantization and bfloat16
// weights for the constant right operands of matrix products, the packed layout the CPU
// kernels read (include/chroma/cpu/gemm_quant.h), and the policy that decides, per weight,
// which format it gets and why.
//
// Format (ml-explore/mlx affine_quantize): groups of 64 consecutive weights along the input
// (contracted) dimension K; per group and output column a scale s and a bias b, w ~ s * q + b,
// q unsigned in [0, 2^bits - 1]. MLX's rule keeps zero exact (see quantize_group). Scales and
// biases are stored in float16 and q is rounded again with the stored values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chroma::quant {

enum class Format : uint8_t { kF32, kBF16, kQ8, kQ6, kQ4 };

inline constexpr int64_t kGroup = 64;  // weights per group along K
inline constexpr int64_t kPanel = 16;  // output columns per packed panel

const char* format_name(Format f);
std::optional<Format> parse_format(std::string_view s);
int format_bits(Format f);  // 32, 16, 8, 6, 4
// Bits per weight stored, scales and biases included (q4: 4.5).
double bits_per_weight(Format f);

// One group of `n` weights w[i * stride] quantized to `bits` bits: q[i] in [0, 2^bits - 1],
// scale and bias rounded to float16 (returned as their float16 bit patterns). Returns false
// when the group holds a NaN or an infinity, or its scale or bias does not fit float16 (a
// range beyond 65504 or a scale that would be 0): such a weight must stay exact.
bool quantize_group(const float* w, int64_t n, int64_t stride, int bits, uint8_t* q, uint16_t* scale, uint16_t* bias);

// A [rows, K] matrix (element (r, k) at w[r * row_stride + k * k_stride]) quantized along K
// in MLX's arrangement: q [rows][K] (one value per byte), scales and biases
// [rows][ceil(K / 64)] as float16 bits. ok is false when some group does not fit float16.
struct Quantized {
  int64_t rows = 0, k = 0;
  std::vector<uint8_t> q;
  std::vector<uint16_t> scales, biases;
  bool ok = true;
};
Quantized quantize_matrix(const float* w, int64_t rows, int64_t k, int64_t row_stride, int64_t k_stride, int bits);

// ---- the packed layout (docs/quantization.md, "Packed layout") ------------------------------
//
// B [K, N] (the product's right operand, element (k, n) at b[k * sk + n * sn]) is cut into
// panels of 16 columns and each panel into groups of 64 rows of K (the last group may be
// shorter; its rows are padded with zeros to a multiple of 4). A group block is a header (q
// formats: 16 float16 scales, then 16 float16 biases, one per column) followed by its rows:
//   bf16: per 2 rows, 32 bfloat16: word 2j+t = w[k0+t][j]                       (64 B)
//   q8:   per 2 rows, 32 bytes:    byte 2j+t = q[k0+t][j]                       (32 B)
//   q4:   per 4 rows, 32 bytes:    byte 2j+t = q[k0+t][j] | q[k0+2+t][j] << 4   (32 B)
//   q6:   per 4 rows, q4's 32 bytes of low nibbles, then 16 bytes of the high 2 bits:
//         byte i = hA(i) | hB(i) << 2 | hA(i+16) << 4 | hB(i+16) << 6, where for word
//         w = 2j+t, hA(w) = q[k0+t][j] >> 4 and hB(w) = q[k0+2+t][j] >> 4            (48 B)
// Panels follow each other; a matrix is `panels * panel_bytes` bytes.
int64_t group_rows_padded(int64_t K, int64_t g);  // rows stored for group g
int64_t panel_bytes(Format f, int64_t K);
inline int64_t panels_of(int64_t N) { return (N + kPanel - 1) / kPanel; }
inline int64_t matrix_bytes(Format f, int64_t K, int64_t N) { return panels_of(N) * panel_bytes(f, K); }

// Packs B into dst (matrix_bytes(f, K, N) bytes). False when f is a q format and some group's
// scale or bias does not fit float16 (nothing useful is written then).
bool pack(Format f, const float* b, int64_t K, int64_t N, int64_t sk, int64_t sn, uint8_t* dst);

// The weights the packed bytes stand for (dequantized: s * q + b, in float), as [K, N]
// row-major: what the kernels compute with, for reports and tests.
std::vector<float> unpack(Format f, const uint8_t* src, int64_t K, int64_t N);

// ---- the row layout (embedding tables read by a Gather) -----------------------------------
//
// A table [rows, H] whose rows a Gather reads is quantized along its rows (H is the input
// dimension of whatever reads the gathered rows). Row r is stored at r * row_bytes(f, H): per
// group of 64 values (the last may be shorter), q formats a float16 scale and a float16 bias
// (4 bytes), then the group's q values packed little-endian, `bits` each (MLX's packing: q8 a
// byte each, q4 two to a byte, low nibble first, q6 four in three bytes), padded to a whole
// byte; bf16: 2 bytes a value, no header.
int64_t row_bytes(Format f, int64_t H);
// Packs table t [rows, H] (row-major) into dst (rows * row_bytes(f, H) bytes); false as pack.
bool pack_rows(Format f, const float* t, int64_t rows, int64_t H, uint8_t* dst);

// ---- the policy ------------------------------------------------------------------------------
//
// A spec is `key=format` items separated by ';' (the Python API writes it from a string or a
// dict): `default=q4` (the fallback), a role (`unembedding`: products whose result reaches a
// graph output through views and elementwise operations only, the logits of a language model;
// `embedding`: a float32 table read by a Gather along its first axis),
// or a name pattern (fnmatch(3), matched against the weight's name: `*.gate.weight=fp32`);
// `activations=` says what the products do with their activations (Activations below);
// `attention=bf16` multiplies attention's two products (the scores, the weights times the
// values) in bfloat16 where the CPU has AMX (their operands rounded to bfloat16, float32
// sums; `fp32`, the default, keeps them float32 unless they are a bfloat16 model's values).
// Patterns and roles are tried in the order given, before the keep-list (which `default`
// does not override) and then the default.
// What the CPU products do with the activations: kAuto (the default) quantizes them to int8 per
// group of 64 for q4 and q6 weights where the CPU has AVX512-VNNI (vpdpbusd; their weights'
// error is 4 to 16 times the activations'), rounds them to bfloat16 otherwise (vdpbf16ps or AMX,
// where the CPU has them); kBF16 always rounds to bfloat16; kFP32 runs the exact float32
// kernels. The runtime's et::QuantActs mirrors these values.
enum class Activations { kAuto = 0, kBF16 = 1, kFP32 = 2 };
const char* activations_name(Activations a);  // "auto", "bf16", "fp32"

struct Rule {
  std::string pattern;  // a role name or an fnmatch pattern
  Format format = Format::kF32;
};
struct Policy {
  std::vector<Rule> rules;
  Format fallback = Format::kF32;
  Activations activations = Activations::kAuto;
  bool attention_bf16 = false;  // attention=bf16
  std::string spec;  // as given
  bool quantizes() const;  // some rule or the fallback is not fp32
};
Policy parse_policy(const std::string& spec);

// The decision for one weight read by a matrix product as a K x N operand.
struct Decision {
  std::string name, role;  // role: "unembedding" or ""
  std::vector<int64_t> shape;  // the operand's [K, N] (times batches/experts: count)
  int64_t matrices = 1;
  Format format = Format::kF32;
  std::string reason;          // why: "default", "rule *.gate.weight", "kept: router/gate", ...
  int64_t bytes_f32 = 0, bytes = 0;
};
// Decides the format of weight `name` (K x N, `matrices` of them) under `p`; the bytes are
// those of the packed layout, or of the row layout for the role "embedding" (N rows of K).
Decision decide(const Policy& p, const std::string& name, const std::string& role, int64_t K, int64_t N, int64_t matrices);

}  // namespace chroma::quant

// The lowered program: what the code generators consume.
//
// Buffers live in four regions, owned separately (as in Glow's AOT bundles): user inputs,
// user outputs (written in place), constant weights (one mmap-able file), and the arena
// (every temporary, at offsets chosen by the memory planner). Kernels run in order; each
// writes one or two buffers and reads buffers through fused expression trees whose leaves
// carry layouts (views are metadata, never copies).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ir/graph.h"
#include "ir/routed_product.h"
#include "ir/spill.h"
#include "lower/layout.h"
#include "quant/quant.h"

namespace chroma {

enum class Region : uint8_t { kInput, kOutput, kConstant, kArena, kState };

struct Buffer {
  Region region = Region::kArena;
  int32_t slot = -1;          // input/output position, constant slot, state (Program::states index)
  TensorType type;
  int64_t offset = -1;        // byte offset in the arena or the weights file
  int32_t first = -1, last = -1;  // kernel indices: producer and last reader (arena only)
  std::string name;
  // How the elements lie in memory, in elements; empty: contiguous row-major. Only arena
  // temporaries of convolutional networks are ever stored otherwise, channels-last
  // (channels_last_strides): user inputs, outputs, constants and state are row-major.
  std::vector<int64_t> strides;
  bool channels_last() const { return !strides.empty(); }
  Layout layout() const { return strides.empty() ? contiguous_layout(type.shape) : Layout{type.shape, strides, 0}; }
};

// A node of a fused expression tree. Leaves: kLoad (buffer through a layout), kLiteral,
// kIota (affine in the index). Inner: kMap (elementwise.def op), kCast.
struct Expr {
  enum Kind : uint8_t { kLoad, kLiteral, kIota, kMap, kCast } kind = kLiteral;
  DType dtype = DType::kF32;
  int32_t buffer = -1;
  Layout layout;                // kLoad: over the expression's shape
  BasicLayout<double> affine;   // kIota: value = iota_base + affine.offset + sum strides * i
  Scalar iota_base;             // kIota (exact for integers)
  Scalar literal;               // kLiteral
  EwOp ew = EwOp::kCount;       // kMap
  // kLoad of grouped weights (GPU targets, Lowerer::reduced_weight): `buffer` holds quant::pack_rows
  // rows of `quant_k` values in format `quant` (q8, q6, q4; K a multiple of 64); `layout` maps
  // the expression's coordinates into the dense float32 tensor [rows, quant_k] they stand for.
  quant::Format quant = quant::Format::kF32;
  int64_t quant_k = 0;
  std::vector<Expr> children;
  Shape shape() const;
  int depth() const;
};

struct Kernel {
  enum Kind : uint8_t { kAssign, kReduce, kArgReduce, kMatMul, kGather, kGatherElements, kConcat, kTopK, kSoftmax, kMatMulPacked, kIndexPut, kScan, kConv, kLinalg, kMatMulGathered, kAttention } kind = kAssign;
  Shape shape;                   // iteration space (kAssign, kReduce, kArgReduce: the input's shape)
  std::vector<Expr> inputs;      // fused input expressions (kMatMul: two kLoad leaves;
                                 // kMatMulPacked: A, then the packed constant, both kLoad;
                                 // kAttention: q, kt, v as kLoad leaves, then the bias's
                                 // expression over the scores' shape, if any)
  std::vector<int32_t> outputs;  // buffers written
  std::vector<Layout> out_layouts;  // how each output is addressed over `shape` (or its own shape)
  Attrs attrs;                   // the IR node's attributes (axes, axis, k, ...)
  std::string label;             // e.g. "Reduce.sum <- add, sin"
  std::string name, source;      // IR node name and source line (for errors)

  // ---- What only some kinds carry: one payload per kind, reached through the accessors
  // below, which check the kind (a kind's payload read through another kind's accessor is an
  // internal error, not a default silently used).

  // How a kernel reads its constant operand (kMatMul, kConv, kMatMulPacked, kMatMulGathered,
  // kGather): the constant's format (quant/quant.h; kF32: float, packed kernels' panels
  // [batches][panels][K][16]; kBF16 on a kMatMul or kConv: oneDNN's bfloat16 kernel; else
  // quant::pack's bytes) and what its products do with the activations (quant::Activations).
  struct Weights {
    quant::Format format = quant::Format::kF32;
    quant::Activations activations = quant::Activations::kAuto;
  };
  // kMatMulPacked: per batch (flattened), element offsets of A, of the packed panels, of C.
  // kMatMulGathered: per job, element offsets of A, of the job's index in the index buffer
  // (its value selects the packed matrix), of C. (b: in bytes for packed bytes.)
  struct Batches {
    std::vector<int64_t> a, b, c;
  };
  // kMatMulPacked of a routed product (LowerOptions::routed): inputs[2] loads the float32
  // expert mask [E]; batch b runs only when mask[experts[b]] != 0 (the others' results are
  // left as they are: only the masked contraction reads them). A product whose columns carry
  // the expert is split into jobs of `n` columns (one expert's block) that replace its batches.
  struct Routed {
    int64_t n = 0;                 // each job's columns (0: the output's)
    std::vector<int64_t> experts;  // per batch / job; empty: not routed
  };
  // kMatMulGathered (inputs: A, the packed experts [E, panels, K, 16], the index buffer):
  // each job is an m x k times k x n product, A addressed A[i * sar + kk * sac], C rows ldc apart.
  struct Gathered {
    int64_t m = 0, n = 0, k = 0, sar = 0, sac = 0, ldc = 0, experts = 0;
  };
  // kConv (channels-last, on oneDNN): arithmetic oneDNN applies to the result before storing
  // it, in order (chroma/cpu/conv.h's ConvPostOp, same numbering); the per-channel ones read a
  // float32 constant vector of Cout elements, inputs[input].
  struct PostOp {
    enum Kind : uint8_t { kBias, kLinear, kAddC, kMulC, kSubC } kind = kLinear;
    float a = 1, b = 0;            // kLinear: a * x + b
    int32_t input = -1;            // per-channel: its load among `inputs`
  };

  // The payloads. `epilogue` (kMatMul with LowerOptions::product_epilogues, kConv): when >= 0,
  // inputs[epilogue] is an elementwise expression over the output shape whose loads of the
  // output buffer itself stand for the kernel's result; the CPU evaluates it in place on each
  // slice of the result oneDNN stored, a GPU kernel on its accumulators before storing
  // (src/lower/epilogue.cpp).
  struct MatMul {
    Weights weights;
    int32_t epilogue = -1;
  };
  struct Conv {
    Weights weights;
    std::vector<PostOp> post_ops;
    int32_t epilogue = -1;
  };
  struct Packed {
    Weights weights;
    Batches batches;
    Routed routed;
  };
  struct GatheredProduct {
    Weights weights;
    Batches batches;
    Gathered job;
  };
  struct Gather {
    Weights weights;               // format != kF32: rows of a quantized table (quant::row_bytes)
  };
  struct IndexPut {
    bool in_place = false;         // the output already holds the base (state)
  };
  using Payload = std::variant<std::monostate, MatMul, Conv, Packed, GatheredProduct, Gather, IndexPut>;
  Payload payload;

  // The payload of this kernel's kind (created on first use). The const forms of a payload
  // not yet created read its defaults.
  MatMul& matmul() { return own<MatMul>(kMatMul); }
  const MatMul& matmul() const { return view<MatMul>(kMatMul); }
  Conv& conv() { return own<Conv>(kConv); }
  const Conv& conv() const { return view<Conv>(kConv); }
  Packed& packed() { return own<Packed>(kMatMulPacked); }
  const Packed& packed() const { return view<Packed>(kMatMulPacked); }
  GatheredProduct& gathered() { return own<GatheredProduct>(kMatMulGathered); }
  const GatheredProduct& gathered() const { return view<GatheredProduct>(kMatMulGathered); }
  IndexPut& index_put() { return own<IndexPut>(kIndexPut); }
  const IndexPut& index_put() const { return view<IndexPut>(kIndexPut); }
  // The packed products' batches (kMatMulPacked, kMatMulGathered).
  Batches& batches() { return kind == kMatMulGathered ? gathered().batches : packed().batches; }
  const Batches& batches() const { return kind == kMatMulGathered ? gathered().batches : packed().batches; }

  // Questions asked of any kernel: its weights (kinds without a constant operand: float32,
  // kAuto; writable for the kinds that have one) and its epilogue (-1: none).
  bool has_weights() const {
    return kind == kMatMul || kind == kConv || kind == kMatMulPacked || kind == kMatMulGathered || kind == kGather;
  }
  Weights& weights();
  const Weights& weights() const;
  quant::Format weight_format() const { return weights().format; }
  quant::Activations activations() const { return weights().activations; }
  int32_t epilogue() const { return kind == kMatMul ? matmul().epilogue : kind == kConv ? conv().epilogue : -1; }
  void set_epilogue(int32_t input) { (kind == kMatMul ? matmul().epilogue : conv().epilogue) = input; }
  // Makes this kernel one of another kind (a copy turned into an Assign), dropping the payload.
  void become(Kind k) {
    kind = k;
    payload = std::monostate{};
  }

 private:
  [[noreturn]] void wrong_kind(Kind want) const;
  template <class P>
  P& own(Kind want) {
    if (kind != want) wrong_kind(want);
    if (!std::holds_alternative<P>(payload)) payload = P{};
    return std::get<P>(payload);
  }
  template <class P>
  const P& view(Kind want) const {
    if (kind != want) wrong_kind(want);
    static const P kDefault{};
    const P* p = std::get_if<P>(&payload);
    return p ? *p : kDefault;
  }
};

struct Program {
  std::vector<Buffer> buffers;
  std::vector<Kernel> kernels;
  std::vector<int32_t> inputs, outputs;  // buffer ids in signature order
  std::vector<std::string> input_names;
  std::string output_structure;
  std::vector<ConstantData> constants;   // by constant slot
  std::vector<StateBinding> states;      // persistent state, by state slot (Graph::states)
  int64_t arena_bytes = 0;
  int64_t arena_lower_bound = 0;
  int64_t temporaries_bytes = 0;         // sum of arena buffer sizes (no reuse)
  std::string plan_description;
  int fused_expressions = 0;             // Map/Cast nodes fused into a consumer
  // Under a weights policy: the format chosen for each constant read by a matrix product, and why.
  std::vector<quant::Decision> weight_decisions;
};

// The bytes one element of `t` takes on a GPU device: 1 for bool, uint8 and int8, 2 for int16,
// float16 and bfloat16, 4 for everything else (int64 is narrowed to 32 bits, float64 is refused).
inline int device_element_bytes(DType t) {
  switch (t) {
    case DType::kBool:
    case DType::kU8:
    case DType::kI8: return 1;
    case DType::kI16:
    case DType::kF16:
    case DType::kBF16: return 2;
    default: return 4;
  }
}
// The bytes a tensor takes on a GPU device: its elements packed, rounded up to whole 32-bit
// words (every tensor starts on a word).
inline int64_t device_storage_bytes(DType t, int64_t numel) { return (device_element_bytes(t) * numel + 3) / 4 * 4; }

struct LowerOptions {
  int max_expression_depth = 32;
  // Float32 products with a constant right operand and at most this many rows use the
  // pre-packed, memory-bound kernel (chroma/cpu/gemm_packed.h) instead of BLAS; 0: never.
  int packed_max_rows = 32;
  // Float32 convolutions run on oneDNN (built with its headers, blas on): their activations
  // are kept channels-last between them (see lowerer.h), the layout oneDNN's direct kernels
  // read and write without reorders.
  bool channels_last = false;
  // Every arena offset is a multiple of this (GPU targets: 256, WebGPU's
  // minStorageBufferOffsetAlignment).
  int arena_alignment = 64;
  // GPU targets: tensors are stored as the device stores them (device_storage_bytes): 64-bit
  // types narrowed to 32-bit words, 8- and 16-bit types packed, whole words per tensor.
  bool device_storage = false;
  // Constant right operands of matrix products read transposed are stored row-major [K, N]
  // (GPU targets: consecutive invocations read consecutive columns).
  bool row_major_constant_b = false;
  // Constant right operands of BLAS products stored row-major with rows a multiple of 1024
  // elements (4 KiB) apart are stored with a row pitch 16 elements longer (CPU target:
  // oneDNN 2.6's sgemm reads such a B unpacked with every row in the same cache sets, at a
  // third of its speed; et::sgemm otherwise copies it on every call, include/chroma/cpu/sgemm.h).
  bool pitch_constant_b = false;
  // Float32 matrix products and convolutions apply the Maps that read their result (bias,
  // activation, residual add: any same-shape float32 Maps whose other operands were computed
  // before the product) as they store it: Kernel::epilogue (GPU targets).
  bool product_epilogues = false;
  // Weight formats for the constant right operands of matrix products (quant/quant.h): a
  // quantized or bfloat16 weight is packed for chroma/cpu/gemm_quant.h, whatever the number
  // of rows (CPU target).
  quant::Policy weights;
  // CPU target: products whose experts the run-time mask can skip (passes/routed_experts.h),
  // by node id of the graph being lowered.
  std::map<int32_t, RoutedProduct> routed;
  // Where the constants the lowering makes (packed, quantized, relaid-out weights) go beyond
  // the first few hundred MiB: a scratch file they are mapped from (ir/spill.h), so a model
  // larger than memory compiles. None: kept in memory.
  std::shared_ptr<SpillFile> spill;
};

// Lowers an optimized graph: decides what is materialized (src/lower/README.md, "Fusion"),
// builds kernels with fused expressions, and plans the arena.
Program lower(const Graph& g, const LowerOptions& opts = {});

// The kind's name in manifests and messages ("assign", "reduce", ...).
const char* kernel_kind(Kernel::Kind k);

// Human-readable listing of kernels and the memory plan (`chroma inspect`).
std::string describe(const Program& p);

}  // namespace chroma

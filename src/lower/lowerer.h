// The lowering pass: the Lowerer class, internal to src/lower. See lower.cpp for the design.
//
// One class whose methods are defined in several files, one part per file; the declarations
// below are grouped by part, each with its contract. The core (lower.cpp) owns the tables
// (the data members): it decides what is materialized before any kernel is built (decide()),
// then visits the nodes in order, and every part builds its kernels and buffers through the
// core's start() / push() / new_buffer() and reads values through expr_of(). The parts:
//  - lower.cpp: the core: decisions, expressions, kernels, the outputs, states and memory plan;
//  - channels_last.cpp: channels-last activations and relayout copies;
//  - lower_products.cpp: matrix products and convolutions: which form each takes, operands;
//  - epilogue.cpp: the post-ops and epilogues a product or convolution applies as it stores;
//  - cpu_products.cpp: the CPU's packed, quantized, gathered, routed and bfloat16 products;
//  - gpu_weights.cpp: constant operands stored for the GPU targets' kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <map>
#include <sstream>

#include "chroma/linalg_kinds.h"
#include "lower/program.h"
#include "memory/planner.h"

namespace chroma::lowering {

// quant::pack refused a weight: a CompileError naming it, its reader, and how to keep it.
[[noreturn]] void unstorable(const std::string& cname, const Node& n, quant::Format f);

class Lowerer {
 public:
  Lowerer(const Graph& g, const LowerOptions& o) : g_(g), opts_(o), mat_(g.size(), false), depth_(g.size(), 0) {}

  Program run();

 private:
  enum class Want : uint8_t { kAny, kContiguous, kChannelsLast };

  // ---- the core's tables ---------------------------------------------------------------------
  //
  // decide() fills the per-node tables before the first kernel; buffer_of_, output_slot_ (the
  // first buffer of an output's value takes its slot), absorbed_, copies_ and p_ change as the
  // kernels are built. Every part may read them all; what each part writes, its contract says.
  const Graph& g_;
  LowerOptions opts_;
  Program p_;
  std::vector<bool> mat_;    // Maps and Casts written to a buffer (the fusion rule)
  std::vector<int> depth_;   // depth of the expression rooted at a Map or Cast (0: a leaf)
  std::map<Value, int32_t> buffer_of_;     // the buffer holding a value, once it has one
  std::map<Value, int32_t> output_slot_;  // first graph-output position of a value
  std::vector<int32_t> fused_into_;        // scratch: nodes inlined into the kernel being built
  std::vector<int32_t> state_of_input_;    // graph input -> state slot, or -1
  std::vector<int32_t> state_of_output_;   // graph output -> state slot, or -1
  std::vector<bool> in_place_;             // IndexPut nodes that write their state directly
  std::vector<bool> deferred_gather_;      // Gathers of constant matrices read only by products
  std::map<std::pair<Value, bool>, int32_t> copies_;  // (value, channels-last?) -> relayout copy
  std::vector<std::vector<int32_t>> consumers_;  // node -> nodes reading it (once per input)
  std::vector<bool> absorbed_;                   // Maps a product applies as post-ops or epilogue
  std::vector<bool> final_;  // nodes whose value reaches a graph output through views and elementwise ops

  // ==== the core (lower.cpp) ===================================================================
  //
  // Decides (decide()) which deferred nodes are written to buffers (mat_, depth_), which
  // state updates write in place (in_place_), which Gathers are left to the products that read
  // them (deferred_gather_), and which products feed the outputs (final_); fills consumers_
  // and output_slot_. Then visits every node in order (visit()), and finishes with the copies
  // into outputs and states and the memory plan. It alone writes those decisions; the parts
  // below add buffers, constants and kernels to p_ through it.

  // ---- decisions ---------------------------------------------------------------------------

  void decide();

  // (a)'s exception: a Map that every reader may compute again for itself, because that costs
  // less than a buffer: one arithmetic operation (add, sub, mul, neg, relu, maximum, minimum)
  // on operands that are all read from memory already (no deferred computation under it), at
  // most one of them as large as the result (the others broadcast, a bias or a scale), at
  // most 4 readers. Each reader then reads the large operand (the same bytes as the buffer)
  // and the buffer's write and read pass are saved: a convolution's or linear layer's bias add
  // fuses into the GELU or SiLU after it, which reads its input twice.
  bool cheap_to_repeat(size_t i, int readers) const;

  // Follows views back to the node that computes the data.
  int32_t source_of(int32_t id) const;

  // ---- buffers -----------------------------------------------------------------------------

  // A buffer holding value v; an arena buffer for a graph output becomes that output, unless
  // it is laid out otherwise than row-major (`strides`: see Buffer): finish_outputs then
  // copies it.
  int32_t new_buffer(Value v, Region r, int32_t slot, std::vector<int64_t> strides = {});

  int32_t new_buffer_of(const TensorType& t, Region r, const std::string& name);

  // A constant read through a view its layout cannot express (value v, read as `src`): a new
  // constant holding v's values contiguously, made once at compile time and used for v from
  // then on (the original stays for other readers).
  int32_t relayout_constant(const Expr& src, Value v);
  // A constant's weight name for the weights policy: its parameter's name ("folded" for a
  // folded constant), without the suffix relayout_constant adds.
  static std::string weight_name(const ConstantData& c);

  // ---- expressions -------------------------------------------------------------------------

  Expr load(int32_t buf);

  // Expression for value v: a load when v has a buffer, else its computation inlined.
  Expr expr_of(Value v);

  static bool map_leaves(Expr& e, const Node& view);

  Expr compute(Value v);

  // ---- kernels -----------------------------------------------------------------------------

  Kernel start(const Node& n, Kernel::Kind k);

  void push(Kernel k, const Node& n);

  // Finishes a kernel that iterates over its node's output shape and writes one new,
  // contiguous buffer for value v.
  void push_over_output(Kernel k, const Node& n, Value v);

  // Writes value v (a deferred node) into a new buffer with an Assign kernel, laid out as
  // `want` says (kAny: channels-last when its operands are; see strides_for).
  void materialize(Value v, Want want = Want::kAny);

  // One node: a buffer for a leaf, a kernel for a kernel node (the longer cases in the
  // visit_* methods), nothing for a deferred node (its readers compute it). A new kernel
  // kind gets its case here.
  void visit(int32_t id);
  void visit_index_put(const Node& n, Value v);
  void visit_reduce(const Node& n, Value v);
  void visit_concat(const Node& n, Value v);

  // ---- outputs, states, memory -------------------------------------------------------------

  // Outputs not written in place by their producer (inputs, constants, views, repeats) get
  // a copy kernel.
  void finish_outputs();

  // New state values not written in place are copied into their state after everything
  // else has run (so every reader saw the old value); a value that is itself some state's
  // buffer is first copied out, so updates like a swap read the old contents.
  void finish_states();

  static void reads(const Expr& e, std::vector<int32_t>& out);

  void plan_memory();

  // ==== channels-last activations (channels_last.cpp) ==========================================
  //
  // With LowerOptions::channels_last, a float32 convolution reads and writes its activations
  // channels-last (the channel innermost, NHWC for images), the layout in which oneDNN's direct
  // kernels run without reordering them into and out of their blocked layouts around each
  // convolution (a large share of mobilenet_v2's time: bench/results/README.md). The layout then
  // spreads to what lies between convolutions: an Assign (bias, activation, residual add) or a
  // Concat whose operands include a channels-last buffer of its own shape is written channels-last
  // too, and the elementwise loops run in the destination's memory order (codegen/cpu/emit_elementwise.cpp), so
  // both are contiguous passes. Everything else reads a channels-last buffer through its layout
  // like any strided view; a consumer that needs row-major memory (a BLAS operand, a reshape the
  // layout cannot express, a graph output) gets a row-major copy, made once per value.
  // Reads the buffers' layouts; writes copies_ and the copies' buffers and Assign kernels
  // (and, through materialize, a deferred value's own buffer).

  // Some operand of e is a channels-last buffer seen over a shape of `shape`'s rank.
  bool prefers_channels_last(const Expr& e, const Shape& shape) const;

  // The strides of a new buffer for value v (computed by e over `shape`): channels-last when
  // LowerOptions::channels_last is set, v is no graph output, its rank is 3 or more and `want`
  // asks for it (kAny: when prefers_channels_last(e)); else empty (row-major).
  std::vector<int64_t> strides_for(const Expr& e, const Shape& shape, Value v, Want want) const;

  // A copy of buffer b (holding v) laid out row-major or channels-last, made once.
  int32_t copy_of(Value v, int32_t b, bool channels_last);

  // Value v read from a buffer in the layout `want` asks for: its own buffer (written now if
  // v is deferred) when that fits, else a copy.
  Expr buffer_load(Value v, Want want);

  // A convolution's input, channels-last.
  Expr channels_last_operand(Value v);

  // ==== products (lower_products.cpp) ===========================================================
  //
  // The kernel a matrix product or convolution becomes: on the CPU a gathered or packed
  // product when one applies (cpu_products.cpp), else a BLAS product (kMatMul) or a
  // convolution (kConv) whose operands are copied when their layout cannot be addressed, its
  // result stored with post-ops and an epilogue (epilogue.cpp) where the target allows.

  // A matrix product: gathered, packed, or a BLAS product of operands it can address.
  void visit_matmul(const Node& n, Value v);
  // A convolution: channels-last with its post-ops and epilogue where the target allows.
  void visit_conv(const Node& n, Value v);

  // A BLAS-addressable operand: inner two dims row- or column-major.
  static bool blas_layout(Layout& l);

  // A contiguous row-major operand (a buffer at some offset), copied into one if needed.
  Expr dense_operand(Value v);

  Expr matmul_operand(Value v);

  // ==== post-ops and epilogues (epilogue.cpp) ===================================================
  //
  // Takes the float32 Maps that read a product's result into its kernel (post-ops, an
  // epilogue), marks them absorbed_ (visit() then never computes them) and records them as
  // fused; gives the product its buffer, which holds the last value taken in. May give a
  // constant its buffer before visit() reaches it.

  // What a channels-last convolution applies to its result before the next kernel reads it.
  //  1. A prefix oneDNN applies in registers (Kernel::PostOp): from the convolution's value,
  //     while the value has one reader, is no graph output, and that reader is a float32 Map
  //     of the same shape adding, subtracting or multiplying it by a literal or a per-channel
  //     constant vector (a bias, an unfolded batch norm's scale and shift).
  //  2. An epilogue (Kernel::epilogue): the float32 Maps of the same shape that read the
  //     value, up to the one node every path from it reaches (SiLU's x * sigmoid(x), GELU,
  //     hardswish, clamps, a residual add and the relu after it), whose other operands are
  //     literals, per-channel or scalar constants, or channels-last buffers of the same shape
  //     (read at the same element). It runs on each slice of the result right after oneDNN
  //     stores it, while it is in cache, and computes exactly what those Maps compute
  //     (emit_conv.cpp prints it with the same scalar functions).
  // The absorbed Maps are never computed again; returns the value the convolution's buffer
  // holds (the last node absorbed), and sets *epilogue_root to the epilogue's root (or to
  // an invalid value when there is none) for the caller to build its expression.
  // With LowerOptions::product_epilogues (GPU targets, where a kernel evaluates any fused
  // expression at the element it stores), there is no post-op prefix and the epilogue's
  // outside operands may be any value computed before the product, read through views.
  Value conv_post_ops(Kernel& k, Value v, Value* epilogue_root);
  // 1.: the post-ops taken into k (with their constant operands as k's inputs); returns
  // the value the last one computes (v when there is none).
  Value post_op_prefix(Kernel& k, Value v);
  // 2.: the epilogue's root (-1: none) for a product v of `shape` whose buffer holds `cur`;
  // the region's Maps are marked absorbed.
  int32_t grow_epilogue(const Shape& shape, Value v, Value cur);
  // The operands post-ops and epilogues take from outside: a floating literal (its value in
  // *out; not a NaN), a float32 constant seen through views over `shape` (made a buffer now
  // if the folder placed it after the product in node order), a layout over `shape` that
  // varies along the channel dimension (1) only, a float32 Map of `shape`.
  bool literal_operand(Value o, float* out) const;
  bool constant_operand(Value o, const Shape& shape, Expr* e);
  static bool per_channel(const Expr& e, const Shape& shape);
  static bool same_shape_map(const Node& m, const Shape& shape);

  // A product (convolution, matrix product) whose result is not a graph output, with the
  // post-ops and epilogue conv_post_ops finds; its buffer laid out with `strides` (empty:
  // contiguous).
  void push_with_epilogue(Kernel k, const Node& n, Value v, std::vector<int64_t> strides);

  // ==== CPU products and weights (cpu_products.cpp) =============================================
  //
  // With LowerOptions::packed_max_rows > 0 (the CPU target): products whose weight is a
  // constant take the packed, quantized, gathered or routed kernels, the weight packed at
  // compile time into a new constant (added to p_.constants with its buffer); a bfloat16
  // model's weights stay bfloat16; the weights policy's decisions go to p_.weight_decisions.
  // Each xxx_matmul returns false when its form does not apply, and visit_matmul tries the
  // next. Reads deferred_gather_, final_ (the role "unembedding"), LowerOptions::routed and
  // ::weights.

  // Adds a float32 constant made at compile time (packed panels) and its buffer; returns
  // the buffer.
  int32_t add_packed_constant(std::string name, Shape shape, const std::vector<float>& data);
  // The same for bytes: a constant of `type` holding `data` (quantized panels: uint8 [bytes]).
  int32_t add_packed_bytes(std::string name, TensorType type, std::vector<uint8_t> data);
  int32_t add_packed_bytes(std::string name, std::vector<uint8_t> data);

  // The weights policy's decision for a product's constant operand (K x N, `matrices` of
  // them) read by node n, recorded in the program when the policy quantizes anything.
  quant::Format weight_format(const Node& n, const std::string& name, int64_t K, int64_t N, int64_t matrices);

  // A product's weight operand: a float32 constant seen through views, or the model's own
  // bfloat16 weight (a bfloat16 constant's widening Cast seen through views, which
  // fold_constants keeps when only products read it). `load` reads the constant as the
  // operand (a bfloat16 load for the latter); values() are its float32 values, indexed as the
  // constant (the bfloat16 ones widened, exactly).
  struct WeightSource {
    Expr load;
    const ConstantData* constant = nullptr;
    bool bf16 = false;
    std::vector<float> widened;
    const float* values() const { return bf16 ? widened.data() : reinterpret_cast<const float*>(constant->data()); }
  };
  std::optional<WeightSource> weight_source(Value v);
  // True when node `id` is the model's bfloat16 weight widened: a Cast from bfloat16 of a
  // constant seen through views (fold_constants keeps it on the CPU when only products read it).
  bool widened_bf16_weight(int32_t id) const;
  // True when v's values are a bfloat16 tensor's (a Cast from bfloat16, seen through views, or
  // a relu / maximum / minimum / abs / neg / where picking among such values and bfloat16
  // literals): rounding them to bfloat16 changes nothing.
  bool bf16_valued(Value v, int depth = 0) const;
  // The format of the model's bfloat16 weight where the policy keeps it float32: bf16, lossless,
  // with bf16 activations when `activations` are a bfloat16 tensor's values, else the exact
  // float32 kernels; the decision goes to the manifest.
  void model_bf16_format(const std::string& cname, int64_t K, int64_t N, int64_t matrices, Value activations,
                         quant::Format* wf, quant::Activations* acts);
  // Convolution n runs in bfloat16 (Kernel::weight_format kBF16): a bfloat16 model's, its
  // input a bfloat16 tensor's values and its weights all bfloat16 values (conversions exact).
  bool conv_bf16(const Node& n);
  // Product n (a bfloat16 model's, bfloat16 activations, many rows) as a kMatMul of weight
  // format bf16 on oneDNN's bfloat16 matmul (chroma/cpu/matmul_dnnl.h); false: not possible.
  bool bf16_dnnl_matmul(const Node& n, Value v, const WeightSource& src);

  // C = A @ B with B a float32 constant and few rows: B is packed into 16-column panels
  // at compile time (a new constant; the original is dropped when nothing else reads it)
  // and the product streams each panel once for all rows.
  bool packed_matmul(const Node& n, Value v);
  // A routed product's batches (or column blocks, which become its batches) tagged with
  // their experts (Kernel::routed); left untagged when its expert axis cannot be split so.
  void routed_jobs(const RoutedProduct& rp, const Shape& batch, int64_t kk, int64_t nn, quant::Format wf, Kernel* k);

  // C = A @ B where one operand is, through views, a deferred Gather of a constant stack of
  // matrices W [E, R, C] by a run-time index (a mixture of experts written as
  // `W[expert_indices]` then a batched product or einsum). Nothing is gathered: every expert
  // matrix is packed at compile time as for packed_matmul, and each product reads the panels
  // of the expert its index selects (bounds-checked like the Gather). The operand's layout
  // over the gathered tensor says which matrix each batch reads and how:
  //  - B gathered, B_b = W[e], or W[e]^T or several experts' W^T side by side: C_b = A_b @ B_b,
  //    column block by column block (A_b at most packed_max_rows rows);
  //  - A gathered, A_b = W[e], W[e]^T, or several experts' W stacked by rows, and B_b one
  //    column: C_b^T = B_b^T @ A_b^T, row block by row block.
  bool gathered_matmul(const Node& n, Value v);

  // A Gather of rows of a float32 constant table that the weights policy quantizes (role
  // "embedding"): the table stored in the row layout, read by et::gather_quant.
  bool quantized_gather(const Node& n, Value v);
  // A Gather or GatherElements kernel (a quantized gather where one applies; on the GPU
  // targets an embedding table in its reduced format).
  void emit_gather(const Node& n, Value v);

  // ==== GPU weights (gpu_weights.cpp) ===========================================================
  //
  // Rewrites a product's or Gather's constant operand expression in place to read a new
  // constant made at compile time (added with add_packed_bytes / add_packed_constant), or
  // leaves it as it is. reduced_weight acts only without packed panels (GPU targets) and
  // records its decisions in p_.weight_decisions; visit_matmul calls row_major_constant where
  // the target's LowerOptions::row_major_constant_b or ::pitch_constant_b asks.

  // GPU targets (no pre-packed panels) under a weights policy: a float32 constant read by a
  // matrix product (role "", `left`: its left operand [M, K]) or by a Gather of rows (role
  // "embedding") is stored in the format decided (recorded like the CPU's decisions): bf16 as
  // a bfloat16 constant of the values the layout selects (broadcast dimensions once) read
  // through a Cast to float32; q8/q6/q4 as quant::pack_rows rows along K read by a load the
  // GPU kernels dequantize (Expr::quant), bf16 instead when K is not a multiple of 64.
  void reduced_weight(const Node& n, Expr* e, const std::string& role, bool left = false);

  // A constant matrix operand read transposed (a linear layer's weight [N, K] as B = W^T) is
  // stored row-major [K, N] instead, a new constant made at compile time (the original is
  // dropped when nothing else reads it): GPU products then read B rows in consecutive
  // invocations (LowerOptions::row_major_constant_b). Handles batches of distinct matrices
  // and one matrix broadcast over every batch; anything else is left as it is.
  // `pitch_only`: instead, a constant B read as it lies (row-major) whose rows are a multiple
  // of sgemm.h's kAliasPitch elements apart is stored again with a row pitch that is not
  // (LowerOptions::pitch_constant_b), so et::sgemm never copies it per call.
  void row_major_constant(Expr* e, bool pitch_only = false);
};

}  // namespace chroma::lowering

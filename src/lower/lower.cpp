// Lowering: fusion decisions, kernel construction, memory planning.
//
// Design. The input graph is optimized IR in topological order. Three classes of nodes:
//  * leaves (Input, Constant) own buffers;
//  * deferred nodes (Map, Cast, Full, Iota and the views) become expression trees inside
//    whichever kernel consumes them; views are pushed down to the leaves as layouts;
//  * kernel nodes (Reduce, ArgReduce, MatMul, Conv, Gather, GatherElements, Concat, TopK,
//    IndexPut, Scan) always
//    write buffers.
// A deferred Map/Cast is written to a buffer (an Assign kernel) only when
//  (a) two or more operations read it (views are transparent: a view's readers count as
//      readers of its source) and it is not cheap to compute again (cheap_to_repeat: one
//      add/sub/mul/neg/relu/max/min of operands in memory, at most one of them full-size,
//      at most 4 readers), or
//  (b) it is a graph output, or
//  (c) its expression would nest deeper than LowerOptions::max_expression_depth, or
//  (d) a consumer needs memory the expression cannot provide: a matrix-product operand
//      whose layout BLAS cannot address, or a reshape the source layout cannot express.
// Full and Iota are leaves of no cost and are never materialized by (a).
//
// Buffers of temporaries live from their producing kernel to their last reader; the
// ArenaPlanner packs them into one arena. Graph outputs are written in place.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <map>
#include <sstream>

#include "chroma/cpu/linalg.h"
#include "lower/program.h"
#include "memory/planner.h"

namespace chroma {

Shape Expr::shape() const {
  switch (kind) {
    case kLoad: return layout.shape;
    case kIota: return affine.shape;
    case kLiteral: return {};
    default: {
      for (const Expr& c : children) {
        if (c.kind != kLiteral) return c.shape();
      }
      return {};
    }
  }
}

int Expr::depth() const {
  int d = 0;
  for (const Expr& c : children) d = std::max(d, c.depth());
  return children.empty() ? 0 : d + 1;
}

namespace {

class Lowerer {
 public:
  Lowerer(const Graph& g, const LowerOptions& o) : g_(g), opts_(o), mat_(g.size(), false), depth_(g.size(), 0) {}

  Program run() {
    p_.constants = g_.constants;
    p_.states = g_.states;
    p_.output_structure = g_.output_structure;
    state_of_input_.assign(g_.inputs.size(), -1);
    state_of_output_.assign(g_.outputs.size(), -1);
    for (size_t s = 0; s < g_.states.size(); ++s) {
      state_of_input_.at(static_cast<size_t>(g_.states[s].input)) = static_cast<int32_t>(s);
      if (g_.states[s].output >= 0) state_of_output_.at(static_cast<size_t>(g_.states[s].output)) = static_cast<int32_t>(s);
    }
    for (size_t i = 0; i < g_.inputs.size(); ++i) {
      if (state_of_input_[i] < 0) p_.input_names.push_back(g_.inputs[i].name);
    }
    decide();
    for (size_t i = 0; i < g_.size(); ++i) visit(static_cast<int32_t>(i));
    finish_outputs();
    plan_memory();
    return std::move(p_);
  }

 private:
  const Graph& g_;
  LowerOptions opts_;
  Program p_;
  std::vector<bool> mat_;
  std::vector<int> depth_;
  std::map<Value, int32_t> buffer_of_;
  std::map<Value, int32_t> output_slot_;  // first graph-output position of a value
  std::vector<int32_t> fused_into_;        // scratch: nodes inlined into the kernel being built
  std::vector<int32_t> state_of_input_;    // graph input -> state slot, or -1
  std::vector<int32_t> state_of_output_;   // graph output -> state slot, or -1
  std::vector<bool> in_place_;             // IndexPut nodes that write their state directly
  std::vector<bool> deferred_gather_;      // Gathers of constant matrices read only by products
  std::map<std::pair<Value, bool>, int32_t> copies_;  // (value, channels-last?) -> relayout copy
  std::vector<std::vector<int32_t>> consumers_;  // node -> nodes reading it (once per input)
  std::vector<bool> absorbed_;                   // Maps a convolution applies as post-ops

  // ---- decisions ---------------------------------------------------------------------------

  void decide() {
    // Effective readers, views transparent: computed backwards.
    std::vector<int> readers(g_.size(), 0);
    std::vector<std::vector<int32_t>>& consumers = consumers_;
    consumers.assign(g_.size(), {});
    for (size_t i = 0; i < g_.size(); ++i) {
      for (Value v : g_.nodes()[i].inputs) consumers[static_cast<size_t>(v.node)].push_back(static_cast<int32_t>(i));
    }
    absorbed_.assign(g_.size(), false);
    for (size_t k = 0; k < g_.outputs.size(); ++k) {
      if (state_of_output_[k] < 0) output_slot_.emplace(g_.outputs[k], static_cast<int32_t>(k));
    }
    // A state update `IndexPut(state, idx, values)` whose state input has no other reader
    // writes its rows straight into the state: no copy of the whole state.
    in_place_.assign(g_.size(), false);
    for (const StateBinding& s : g_.states) {
      if (s.output < 0) continue;
      const Value v = g_.outputs[static_cast<size_t>(s.output)];
      const Node& n = g_.node(v);
      const int32_t in_node = g_.inputs[static_cast<size_t>(s.input)].node;
      if (n.op != Op::kIndexPut || n.inputs[0] != Value{in_node, 0}) continue;
      const auto& cs = consumers[static_cast<size_t>(in_node)];
      bool output = false;
      for (Value o : g_.outputs) output = output || o.node == in_node;
      if (cs.size() == 1 && !output) in_place_[static_cast<size_t>(v.node)] = true;
    }
    for (size_t i = g_.size(); i-- > 0;) {
      int r = 0;
      for (int32_t c : consumers[i]) r += is_view(g_.node(c).op) ? readers[static_cast<size_t>(c)] : 1;
      readers[i] = r;
    }
    for (Value v : g_.outputs) readers[static_cast<size_t>(v.node)] += 1;
    // A Gather of a constant stack of float32 matrices [E, R, C] along axis 0 (the experts
    // a router picked) whose readers, through views, are all matrix products is not
    // written out: the products read the selected matrices in place (gathered_matmul), or
    // the Gather is written when a product cannot (compute()).
    deferred_gather_.assign(g_.size(), false);
    for (size_t i = 0; i < g_.size(); ++i) {
      const Node& n = g_.nodes()[i];
      if (n.op != Op::kGather || n.attrs.axis != 0 || n.inputs.size() != 2) continue;
      const TensorType& wt = g_.type(n.inputs[0]);
      if (g_.node(source_of(n.inputs[0].node)).op != Op::kConstant || wt.dtype != DType::kF32 || wt.shape.size() != 3) continue;
      bool ok = !consumers[i].empty() && !output_slot_.count(Value{static_cast<int32_t>(i), 0});
      std::vector<int32_t> todo = consumers[i];
      while (ok && !todo.empty()) {
        const int32_t c = todo.back();
        todo.pop_back();
        const Node& cn = g_.node(c);
        if (is_view(cn.op) && !output_slot_.count(Value{c, 0})) {
          todo.insert(todo.end(), consumers[static_cast<size_t>(c)].begin(), consumers[static_cast<size_t>(c)].end());
        } else if (cn.op != Op::kMatMul) {
          ok = false;
        }
      }
      deferred_gather_[i] = ok;
    }
    const int max_depth = std::max(1, opts_.max_expression_depth);
    for (size_t i = 0; i < g_.size(); ++i) {
      const Node& n = g_.nodes()[i];
      if (n.op != Op::kMap && n.op != Op::kCast) continue;
      if (output_slot_.count(Value{static_cast<int32_t>(i), 0}) || (readers[i] >= 2 && !cheap_to_repeat(i, readers[i]))) {
        mat_[i] = true;
      }
      // Depth of the tree rooted here; too deep: cut at the deepest operand until it fits.
      for (;;) {
        int d = 0;
        int32_t deepest = -1;
        for (Value v : n.inputs) {
          const int32_t src = source_of(v.node);
          const int dv = depth_[static_cast<size_t>(src)];
          if (dv > d) {
            d = dv;
            deepest = src;
          }
        }
        if (d + 1 <= max_depth) {
          depth_[i] = d + 1;
          break;
        }
        mat_[static_cast<size_t>(deepest)] = true;
        depth_[static_cast<size_t>(deepest)] = 0;
      }
      if (mat_[i]) depth_[i] = 0;  // consumers read it as a leaf
    }
  }

  // (a)'s exception: a Map that every reader may compute again for itself, because that costs
  // less than a buffer: one arithmetic operation (add, sub, mul, neg, relu, maximum, minimum)
  // on operands that are all read from memory already (no deferred computation under it), at
  // most one of them as large as the result (the others broadcast, a bias or a scale), at
  // most 4 readers. Each reader then reads the large operand (the same bytes as the buffer)
  // and the buffer's write and read pass are saved: a convolution's or linear layer's bias add
  // fuses into the GELU or SiLU after it, which reads its input twice.
  bool cheap_to_repeat(size_t i, int readers) const {
    const Node& n = g_.nodes()[i];
    if (n.op != Op::kMap || readers > 4) return false;
    static constexpr EwOp kCheap[] = {EwOp::k_add, EwOp::k_sub,     EwOp::k_mul,    EwOp::k_neg,
                                      EwOp::k_relu, EwOp::k_maximum, EwOp::k_minimum};
    if (std::find(std::begin(kCheap), std::end(kCheap), n.attrs.ew) == std::end(kCheap)) return false;
    const int64_t size = numel(n.type(0).shape);
    int large = 0;
    for (Value v : n.inputs) {
      while (is_view(g_.node(v).op)) v = g_.node(v).inputs[0];
      const Op op = g_.node(v).op;
      if (op == Op::kFull || op == Op::kIota) continue;  // literals and index arithmetic: free
      if ((op == Op::kMap || op == Op::kCast) && !mat_[static_cast<size_t>(v.node)]) return false;
      if (4 * numel(g_.type(v).shape) > size) ++large;
    }
    return large <= 1;
  }

  // Follows views back to the node that computes the data.
  int32_t source_of(int32_t id) const {
    while (is_view(g_.node(id).op)) id = g_.node(id).inputs[0].node;
    return id;
  }

  // ---- buffers -----------------------------------------------------------------------------

  // A buffer holding value v; an arena buffer for a graph output becomes that output, unless
  // it is laid out otherwise than row-major (`strides`: see Buffer): finish_outputs then
  // copies it.
  int32_t new_buffer(Value v, Region r, int32_t slot, std::vector<int64_t> strides = {}) {
    auto it = output_slot_.find(v);
    if (r == Region::kArena && it != output_slot_.end() && strides.empty()) {
      r = Region::kOutput;
      slot = it->second;
      output_slot_.erase(it);  // the first occurrence is written in place
    }
    const int32_t id = new_buffer_of(g_.type(v), r, g_.node(v).name);
    p_.buffers[static_cast<size_t>(id)].slot = slot;
    p_.buffers[static_cast<size_t>(id)].strides = std::move(strides);
    buffer_of_[v] = id;
    return id;
  }

  // ---- channels-last activations -------------------------------------------------------
  //
  // With LowerOptions::channels_last, a float32 convolution reads and writes its activations
  // channels-last (the channel innermost, NHWC for images), the layout in which oneDNN's
  // direct kernels run without reordering them into and out of their blocked layouts around
  // each convolution (mobilenet_v2 spent 4.2 of 10.2 ms in those reorders). The layout then
  // spreads to what lies between convolutions: an Assign (bias, activation, residual add) or
  // a Concat whose operands include a channels-last buffer of its own shape is written
  // channels-last too, and the elementwise loops run in the destination's memory order
  // (codegen/cpu/emit.cpp), so both are contiguous passes. Everything else reads a
  // channels-last buffer through its layout like any strided view; a consumer that needs
  // row-major memory (a BLAS operand, a reshape the layout cannot express, a graph output)
  // gets a row-major copy, made once per value.
  enum class Want : uint8_t { kAny, kContiguous, kChannelsLast };

  // Some operand of e is a channels-last buffer seen over a shape of `shape`'s rank.
  bool prefers_channels_last(const Expr& e, const Shape& shape) const {
    if (e.kind == Expr::kLoad) {
      return p_.buffers[static_cast<size_t>(e.buffer)].channels_last() && e.layout.shape.size() == shape.size() &&
             e.layout.shape == shape;
    }
    for (const Expr& c : e.children) {
      if (prefers_channels_last(c, shape)) return true;
    }
    return false;
  }

  std::vector<int64_t> strides_for(const Expr& e, const Shape& shape, Value v, Want want) const {
    if (!opts_.channels_last || shape.size() < 3 || output_slot_.count(v)) return {};
    if (want == Want::kChannelsLast || (want == Want::kAny && prefers_channels_last(e, shape))) return channels_last_strides(shape);
    return {};
  }

  // A copy of buffer b (holding v) laid out row-major or channels-last, made once.
  int32_t copy_of(Value v, int32_t b, bool channels_last) {
    const auto key = std::make_pair(v, channels_last);
    if (auto it = copies_.find(key); it != copies_.end()) return it->second;
    std::vector<int32_t> saved;
    saved.swap(fused_into_);
    const Node& n = g_.node(v);
    Kernel k = start(n, Kernel::kAssign);
    k.shape = g_.type(v).shape;
    k.inputs.push_back(load(b));
    const int32_t out = new_buffer_of(g_.type(v), Region::kArena, n.name);
    if (channels_last) p_.buffers[static_cast<size_t>(out)].strides = channels_last_strides(k.shape);
    k.outputs.push_back(out);
    k.out_layouts.push_back(p_.buffers[static_cast<size_t>(out)].layout());
    push(std::move(k), n);
    p_.kernels.back().label = std::string(channels_last ? "Relayout.channels_last" : "Relayout.row_major") + " <- " +
                              std::string(op_info(n.op).name);
    fused_into_.swap(saved);
    copies_.emplace(key, out);
    return out;
  }

  // Value v read from a buffer in the layout `want` asks for: its own buffer (written now if
  // v is deferred) when that fits, else a copy.
  Expr buffer_load(Value v, Want want) {
    materialize(v, want);
    const int32_t b = buffer_of_.at(v);
    const bool cl = p_.buffers[static_cast<size_t>(b)].channels_last();
    if (want == Want::kContiguous && cl) return load(copy_of(v, b, false));
    if (want == Want::kChannelsLast && !cl && !is_channels_last(load(b).layout)) return load(copy_of(v, b, true));
    return load(b);
  }

  // ---- expressions -------------------------------------------------------------------------

  Expr load(int32_t buf) {
    Expr e;
    e.kind = Expr::kLoad;
    e.buffer = buf;
    e.dtype = p_.buffers[static_cast<size_t>(buf)].type.dtype;
    e.layout = p_.buffers[static_cast<size_t>(buf)].layout();
    return e;
  }

  // Expression for value v: a load when v has a buffer, else its computation inlined.
  Expr expr_of(Value v) {
    auto it = buffer_of_.find(v);
    if (it != buffer_of_.end()) return load(it->second);
    return compute(v);
  }

  static bool map_leaves(Expr& e, const Node& view) {
    if (e.kind == Expr::kLoad) {
      auto l = apply_view(view, e.layout);
      if (!l) return false;
      e.layout = *l;
      return true;
    }
    if (e.kind == Expr::kIota) {
      auto l = apply_view(view, e.affine);
      if (!l) return false;
      e.affine = *l;
      return true;
    }
    for (Expr& c : e.children) {
      if (!map_leaves(c, view)) return false;
    }
    return true;
  }

  Expr compute(Value v) {
    const Node& n = g_.node(v);
    Expr e;
    e.dtype = n.type(v.index).dtype;
    switch (n.op) {
      case Op::kFull:
        e.kind = Expr::kLiteral;
        e.literal = n.attrs.scalar;
        return e;
      case Op::kIota:
        e.kind = Expr::kIota;
        e.affine.shape = n.attrs.ints;
        e.affine.strides = n.attrs.coeffs;
        e.affine.offset = 0.0;
        e.iota_base = n.attrs.scalar;
        return e;
      case Op::kMap:
      case Op::kCast:
        e.kind = n.op == Op::kMap ? Expr::kMap : Expr::kCast;
        e.ew = n.attrs.ew;
        for (Value in : n.inputs) e.children.push_back(expr_of(in));
        fused_into_.push_back(v.node);
        return e;
      case Op::kPermute:
      case Op::kExpand:
      case Op::kSlice:
      case Op::kReshape:
      case Op::kFlip: {
        const size_t mark = fused_into_.size();
        Expr src = expr_of(n.inputs[0]);
        if (map_leaves(src, n)) return src;
        // The source layout cannot express this view: give the source its own buffer.
        fused_into_.resize(mark);
        src = buffer_load(n.inputs[0], Want::kContiguous);
        if (!map_leaves(src, n)) throw CompileError("internal: view of a contiguous buffer failed at " + g_.describe(v.node));
        return src;
      }
      case Op::kGather:
        if (deferred_gather_[static_cast<size_t>(v.node)]) {
          // A product that cannot read the selected matrices in place: write the Gather now.
          std::vector<int32_t> saved;
          saved.swap(fused_into_);
          emit_gather(n, v);
          fused_into_.swap(saved);
          return load(buffer_of_.at(v));
        }
        throw CompileError("internal: " + g_.describe(v.node) + " has no buffer when read");
      default:
        throw CompileError("internal: " + g_.describe(v.node) + " has no buffer when read");
    }
  }

  // ---- kernels -----------------------------------------------------------------------------

  Kernel start(const Node& n, Kernel::Kind k) {
    Kernel kr;
    kr.kind = k;
    kr.attrs = n.attrs;
    kr.name = n.name;
    kr.source = n.source;
    fused_into_.clear();
    return kr;
  }

  void push(Kernel k, const Node& n) {
    std::ostringstream label;
    label << op_info(n.op).name;
    if (n.op == Op::kMap) label << "." << ew_info(n.attrs.ew).name;
    if (n.op == Op::kReduce || n.op == Op::kArgReduce || n.op == Op::kScan) label << "." << reduce_name(n.attrs.reduce);
    if (n.op == Op::kLinalg) label << "." << linalg::kKindNames[n.attrs.k];
    std::vector<std::string> fused;
    for (int32_t id : fused_into_) {
      const Node& f = g_.node(id);
      fused.push_back(f.op == Op::kMap ? std::string(ew_info(f.attrs.ew).name) : std::string(op_info(f.op).name));
    }
    if (!fused.empty()) {
      label << " <-";
      for (const std::string& s : fused) label << " " << s;
    }
    k.label = label.str();
    p_.fused_expressions += static_cast<int>(fused_into_.size());
    p_.kernels.push_back(std::move(k));
    fused_into_.clear();
  }

  // Finishes a kernel that iterates over its node's output shape and writes one new,
  // contiguous buffer for value v.
  void push_over_output(Kernel k, const Node& n, Value v) {
    k.shape = n.type().shape;
    k.outputs.push_back(new_buffer(v, Region::kArena, -1));
    k.out_layouts.push_back(contiguous_layout(k.shape));
    push(std::move(k), n);
  }

  // Writes value v (a deferred node) into a new buffer with an Assign kernel, laid out as
  // `want` says (kAny: channels-last when its operands are; see strides_for).
  void materialize(Value v, Want want = Want::kAny) {
    if (buffer_of_.count(v)) return;
    const Node& n = g_.node(v);
    std::vector<int32_t> saved;
    saved.swap(fused_into_);
    Kernel k = start(n, Kernel::kAssign);
    Expr e = compute(v);
    // compute() records v itself as fused when it is a Map/Cast: it is the kernel's root.
    if (!fused_into_.empty() && fused_into_.back() == v.node) fused_into_.pop_back();
    k.shape = g_.type(v).shape;
    std::vector<int64_t> strides = strides_for(e, k.shape, v, want);
    k.inputs.push_back(std::move(e));
    k.outputs.push_back(new_buffer(v, Region::kArena, -1, std::move(strides)));
    k.out_layouts.push_back(p_.buffers[static_cast<size_t>(k.outputs[0])].layout());
    push(std::move(k), n);
    fused_into_.swap(saved);
  }

  // A BLAS-addressable operand: inner two dims row- or column-major.
  static bool blas_layout(Layout& l) {
    const size_t r = l.shape.size();
    int64_t& sr = l.strides[r - 2];
    int64_t& sc = l.strides[r - 1];
    const int64_t rows = l.shape[r - 2], cols = l.shape[r - 1];
    if (cols == 1 && sc != 1 && !(rows > 1 && sr == 1)) sc = 1;
    if (rows == 1 && sr != 1) sr = std::max<int64_t>(cols, 1);
    if (sc == 1 && sr >= std::max<int64_t>(cols, 1)) return true;
    if (sr == 1 && sc >= std::max<int64_t>(rows, 1)) return true;
    return false;
  }

  // A contiguous row-major operand (a buffer at some offset), copied into one if needed.
  Expr dense_operand(Value v) {
    const size_t mark = fused_into_.size();
    Expr e = expr_of(v);
    if (e.kind == Expr::kLoad && e.layout.strides == contiguous_strides(e.layout.shape)) return e;
    fused_into_.resize(mark);
    return buffer_load(v, Want::kContiguous);
  }

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
  //     (emit.cpp prints it with the same scalar functions).
  // The absorbed Maps are never computed again; returns the value the convolution's buffer
  // holds (the last node absorbed), and sets *epilogue_root to the epilogue's root (or to
  // an invalid value when there is none) for the caller to build its expression.
  // With LowerOptions::product_epilogues (GPU targets, where a kernel evaluates any fused
  // expression at the element it stores), there is no post-op prefix and the epilogue's
  // outside operands may be any value computed before the product, read through views.
  Value conv_post_ops(Kernel& k, Value v, Value* epilogue_root) {
    const Shape& shape = k.shape;
    using P = Kernel::PostOp;
    auto literal = [&](Value o, float* out) {
      const Node& src = g_.node(source_of(o.node));
      if (src.op != Op::kFull || !is_float(src.type().dtype)) return false;
      *out = static_cast<float>(src.attrs.scalar.as_double());
      return !std::isnan(*out);
    };
    // A float32 constant seen through views, made a buffer now if the folder placed it after
    // the convolution in node order.
    auto constant = [&](Value o, Expr* e) {
      const int32_t src = source_of(o.node);
      if (g_.node(src).op != Op::kConstant || g_.type(o).dtype != DType::kF32) return false;
      if (!buffer_of_.count(Value{src, 0})) new_buffer(Value{src, 0}, Region::kConstant, static_cast<int32_t>(g_.node(src).attrs.index));
      const size_t mark = fused_into_.size();
      *e = expr_of(o);
      fused_into_.resize(mark);
      return e->kind == Expr::kLoad && p_.buffers[static_cast<size_t>(e->buffer)].region == Region::kConstant &&
             e->layout.shape == shape;
    };
    auto per_channel = [&](const Expr& e) {
      for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] != 1 && e.layout.strides[d] != (d == 1 ? 1 : 0)) return false;
      }
      return true;
    };
    auto same_shape_map = [&](const Node& m) {
      return m.op == Op::kMap && m.type().dtype == DType::kF32 && m.type().shape == shape;
    };
    Value cur = v;
    *epilogue_root = Value{-1, 0};
    const bool gpu = opts_.product_epilogues;
    for (;;) {
      if (gpu || output_slot_.count(cur)) break;
      const std::vector<int32_t>& cs = consumers_[static_cast<size_t>(cur.node)];
      if (cs.size() != 1) break;
      const Node& m = g_.node(cs[0]);
      if (!same_shape_map(m) || m.inputs.size() != 2) break;
      const EwOp ew = m.attrs.ew;
      if (ew != EwOp::k_add && ew != EwOp::k_sub && ew != EwOp::k_mul) break;
      const bool first = m.inputs[0] == cur;
      const Value o = m.inputs[first ? 1 : 0];
      P op;
      float c = 0;
      Expr e;
      if (literal(o, &c)) {
        if (ew == EwOp::k_add) op = P{P::kLinear, 1.0f, c, -1};
        else if (ew == EwOp::k_mul) op = P{P::kLinear, c, 0.0f, -1};
        else op = first ? P{P::kLinear, 1.0f, -c, -1} : P{P::kLinear, -1.0f, c, -1};
      } else if (constant(o, &e) && per_channel(e) && (ew != EwOp::k_sub || first)) {
        op.kind = ew == EwOp::k_mul ? P::kMulC : ew == EwOp::k_sub ? P::kSubC : P::kAddC;
        if (op.kind == P::kAddC && k.post_ops.empty()) op.kind = P::kBias;
        k.inputs.push_back(std::move(e));
        op.input = static_cast<int32_t>(k.inputs.size() - 1);
      } else {
        break;
      }
      k.post_ops.push_back(op);
      absorbed_[static_cast<size_t>(cs[0])] = true;
      fused_into_.push_back(cs[0]);
      cur = Value{cs[0], 0};
    }
    // The epilogue: grow the set of Maps reading `cur` until one node of it (the root) is the
    // only one read from outside; then try to take the root's readers in too, and so on.
    if (output_slot_.count(cur) || consumers_[static_cast<size_t>(cur.node)].empty()) return cur;
    constexpr size_t kMaxNodes = 16;
    auto in = [](const std::vector<int32_t>& r, int32_t id) { return std::find(r.begin(), r.end(), id) != r.end(); };
    // Every operand from outside: cur, a literal, a constant per channel or scalar, or a
    // channels-last float32 buffer of the same shape, read directly (no view).
    auto leaf_ok = [&](const std::vector<int32_t>& r, Value x) {
      if (x == cur || in(r, x.node)) return true;
      float c = 0;
      Expr e;
      if (literal(x, &c)) return true;
      if (gpu) {
        const int32_t src = source_of(x.node);
        const Op op = g_.node(src).op;
        if (op == Op::kConstant && !buffer_of_.count(Value{src, 0})) {
          new_buffer(Value{src, 0}, Region::kConstant, static_cast<int32_t>(g_.node(src).attrs.index));
        }
        return op == Op::kConstant || op == Op::kFull || op == Op::kIota || x.node < v.node;
      }
      if (g_.node(source_of(x.node)).op == Op::kConstant) {
        return constant(x, &e) &&
               (per_channel(e) || std::all_of(e.layout.strides.begin(), e.layout.strides.end(), [](int64_t st) { return st == 0; }));
      }
      auto it = buffer_of_.find(x);
      if (it == buffer_of_.end()) return false;
      const Buffer& b = p_.buffers[static_cast<size_t>(it->second)];
      return b.channels_last() && b.type.shape == shape && b.type.dtype == DType::kF32;
    };
    // The root of the smallest closed region containing `seed`, growing it in place; -1 if
    // there is none within kMaxNodes.
    auto close = [&](std::vector<int32_t>& r) -> int32_t {
      for (;;) {
        if (r.size() > kMaxNodes) return -1;
        std::vector<int32_t> open;  // read from outside the region, or a graph output
        for (int32_t id : r) {
          if (!same_shape_map(g_.node(id))) return -1;
          for (Value x : g_.node(id).inputs) {
            if (!leaf_ok(r, x)) return -1;
          }
          bool outside = output_slot_.count(Value{id, 0}) > 0 || consumers_[static_cast<size_t>(id)].empty();
          for (int32_t c : consumers_[static_cast<size_t>(id)]) outside = outside || !in(r, c);
          if (outside) open.push_back(id);
        }
        if (open.size() == 1) return open[0];
        if (open.empty()) return -1;
        // Pull in the readers of every open node but the latest in node order (the root to be).
        const int32_t latest = *std::max_element(open.begin(), open.end());
        bool grew = false;
        for (int32_t id : open) {
          if (id == latest) continue;
          if (output_slot_.count(Value{id, 0})) return -1;
          for (int32_t c : consumers_[static_cast<size_t>(id)]) {
            if (!in(r, c)) {
              r.push_back(c);
              grew = true;
            }
          }
        }
        if (!grew) return -1;
      }
    };
    std::vector<int32_t> region, trial = consumers_[static_cast<size_t>(cur.node)];
    int32_t root = -1;
    for (;;) {
      const int32_t r = close(trial);
      if (r < 0) break;
      region = trial;
      root = r;
      if (output_slot_.count(Value{root, 0}) || consumers_[static_cast<size_t>(root)].empty()) break;
      for (int32_t c : consumers_[static_cast<size_t>(root)]) {
        if (!in(trial, c)) trial.push_back(c);
      }
    }
    if (root < 0) return cur;
    for (int32_t id : region) absorbed_[static_cast<size_t>(id)] = true;
    *epilogue_root = Value{root, 0};
    return cur;
  }

  // A product (convolution, matrix product) whose result is not a graph output, with the
  // post-ops and epilogue conv_post_ops finds; its buffer laid out with `strides` (empty:
  // contiguous).
  void push_with_epilogue(Kernel k, const Node& n, Value v, std::vector<int64_t> strides) {
    k.shape = n.type().shape;
    Value root;
    const Value last = conv_post_ops(k, v, &root);
    // A row-major root that is a graph output is written there directly.
    const int32_t out = new_buffer(root.node >= 0 ? root : last, Region::kArena, -1, std::move(strides));
    buffer_of_[last] = out;
    k.outputs.push_back(out);
    k.out_layouts.push_back(p_.buffers[static_cast<size_t>(out)].layout());
    if (root.node >= 0) {
      // The epilogue's expression, `last` read from the buffer itself; the buffer then
      // holds the root's value.
      Expr e = compute(root);
      buffer_of_.erase(last);
      buffer_of_[root] = out;
      k.inputs.push_back(std::move(e));
      k.epilogue = static_cast<int32_t>(k.inputs.size() - 1);
    }
    push(std::move(k), n);
  }

  // A convolution's input, channels-last.
  Expr channels_last_operand(Value v) {
    const size_t mark = fused_into_.size();
    Expr e = expr_of(v);
    if (e.kind == Expr::kLoad && is_channels_last(e.layout)) return e;
    fused_into_.resize(mark);
    return buffer_load(v, Want::kChannelsLast);
  }

  Expr matmul_operand(Value v) {
    const size_t mark = fused_into_.size();
    Expr e = expr_of(v);
    if (e.kind == Expr::kLoad && blas_layout(e.layout)) return e;
    // An expression, or a view BLAS cannot address: copy it into a contiguous buffer.
    fused_into_.resize(mark);
    e = buffer_load(v, Want::kContiguous);
    blas_layout(e.layout);
    return e;
  }

  // Adds a float32 constant made at compile time (packed panels) and its buffer; returns
  // the buffer.
  int32_t add_packed_constant(std::string name, Shape shape, const std::vector<float>& data) {
    ConstantData pc;
    pc.name = std::move(name);
    pc.type = TensorType{DType::kF32, std::move(shape)};
    auto bytes = std::make_shared<std::vector<uint8_t>>(data.size() * sizeof(float));
    std::memcpy(bytes->data(), data.data(), bytes->size());
    pc.bytes = std::move(bytes);
    p_.constants.push_back(std::move(pc));
    Buffer pb;
    pb.region = Region::kConstant;
    pb.slot = static_cast<int32_t>(p_.constants.size() - 1);
    pb.type = p_.constants.back().type;
    pb.name = p_.constants.back().name;
    p_.buffers.push_back(pb);
    return static_cast<int32_t>(p_.buffers.size() - 1);
  }

  // A constant matrix operand read transposed (a linear layer's weight [N, K] as B = W^T) is
  // stored row-major [K, N] instead, a new constant made at compile time (the original is
  // dropped when nothing else reads it): GPU products then read B rows in consecutive
  // invocations (LowerOptions::row_major_constant_b). Handles batches of distinct matrices
  // and one matrix broadcast over every batch; anything else is left as it is.
  void row_major_constant(Expr* e) {
    if (e->kind != Expr::kLoad || dtype_size(e->dtype) != 4) return;
    const Buffer& buf = p_.buffers[static_cast<size_t>(e->buffer)];
    if (buf.region != Region::kConstant) return;
    const Layout& l = e->layout;
    const size_t r = l.shape.size();
    if (r < 2 || l.strides[r - 1] == 1 || numel(l.shape) == 0) return;
    const Shape batch(l.shape.begin(), l.shape.end() - 2);
    bool broadcast = true, distinct = true;
    for (size_t d = 0; d < batch.size(); ++d) {
      if (batch[d] == 1) continue;
      broadcast = broadcast && l.strides[d] == 0;
      distinct = distinct && l.strides[d] != 0;
    }
    if (!broadcast && !distinct) return;
    const int64_t kk = l.shape[r - 2], nn = l.shape[r - 1];
    const int64_t nb = broadcast ? 1 : numel(batch);
    const ConstantData& c = p_.constants[static_cast<size_t>(buf.slot)];
    const auto* src = reinterpret_cast<const uint32_t*>(c.data());
    std::vector<float> out(static_cast<size_t>(nb * kk * nn));
    auto* dst = reinterpret_cast<uint32_t*>(out.data());
    std::vector<int64_t> idx(batch.size(), 0);
    for (int64_t b = 0; b < nb; ++b) {
      int64_t o = l.offset;
      for (size_t d = 0; d < batch.size(); ++d) o += idx[d] * l.strides[d];
      for (int64_t q = 0; q < kk; ++q)
        for (int64_t j = 0; j < nn; ++j) dst[(b * kk + q) * nn + j] = src[o + q * l.strides[r - 2] + j * l.strides[r - 1]];
      for (size_t d = batch.size(); d-- > 0;) {
        if (++idx[d] < batch[d]) break;
        idx[d] = 0;
      }
    }
    Shape shape = broadcast ? Shape{kk, nn} : l.shape;
    const int32_t nbuf = add_packed_constant((c.name.empty() ? "folded" : c.name) + ".row_major", shape, out);
    p_.buffers[static_cast<size_t>(nbuf)].type.dtype = e->dtype;  // the bits of any 4-byte type
    p_.constants.back().type.dtype = e->dtype;
    Layout nl;
    nl.shape = l.shape;
    nl.strides.assign(r, 0);
    nl.strides[r - 1] = 1;
    nl.strides[r - 2] = nn;
    if (!broadcast) {
      int64_t st = kk * nn;
      for (size_t d = batch.size(); d-- > 0;) {
        nl.strides[d] = batch[d] == 1 ? 0 : st;
        st *= batch[d];
      }
    }
    e->buffer = nbuf;
    e->layout = nl;
  }

  // C = A @ B with B a float32 constant and few rows: B is packed into 16-column panels
  // at compile time (a new constant; the original is dropped when nothing else reads it)
  // and the product streams each panel once for all rows.
  bool packed_matmul(const Node& n, Value v) {
    const TensorType& ct = n.type();
    const size_t r = ct.shape.size();
    if (ct.dtype != DType::kF32 || r < 2 || opts_.packed_max_rows <= 0) return false;
    const int64_t m = ct.shape[r - 2], nn = ct.shape[r - 1];
    const int64_t kk = g_.type(n.inputs[0]).shape[r - 1];
    if (m < 1 || m > opts_.packed_max_rows || nn < 1 || kk < 1) return false;
    Expr eb;
    {
      // B must be a constant seen through views (no computation).
      if (g_.node(source_of(n.inputs[1].node)).op != Op::kConstant) return false;
      const size_t mark = fused_into_.size();
      eb = expr_of(n.inputs[1]);
      fused_into_.resize(mark);
      if (eb.kind != Expr::kLoad || p_.buffers[static_cast<size_t>(eb.buffer)].region != Region::kConstant) return false;
    }
    Kernel k = start(n, Kernel::kMatMulPacked);
    Expr ea = matmul_operand(n.inputs[0]);
    const ConstantData& cb = p_.constants[static_cast<size_t>(p_.buffers[static_cast<size_t>(eb.buffer)].slot)];
    const auto* bsrc = reinterpret_cast<const float*>(cb.data());
    const int64_t panels = (nn + 15) / 16;
    const int64_t panel_elems = panels * kk * 16;
    const Shape batch(ct.shape.begin(), ct.shape.end() - 2);
    const int64_t nb = numel(batch);
    std::map<int64_t, int64_t> packed_of;  // source offset -> packed index
    std::vector<float> packed;
    std::vector<int64_t> idx(batch.size(), 0);
    for (int64_t b = 0; b < nb; ++b) {
      int64_t ao = ea.layout.offset, bo = eb.layout.offset;
      for (size_t d = 0; d < batch.size(); ++d) {
        ao += idx[d] * ea.layout.strides[d];
        bo += idx[d] * eb.layout.strides[d];
      }
      auto [pit, fresh] = packed_of.emplace(bo, static_cast<int64_t>(packed_of.size()));
      if (fresh) {
        const int64_t sk = eb.layout.strides[r - 2], sn = eb.layout.strides[r - 1];
        packed.resize(packed.size() + static_cast<size_t>(panel_elems), 0.0f);
        float* dst = packed.data() + pit->second * panel_elems;
        for (int64_t p = 0; p < panels; ++p)
          for (int64_t q = 0; q < kk; ++q)
            for (int64_t j = 0; j < 16 && p * 16 + j < nn; ++j) dst[(p * kk + q) * 16 + j] = bsrc[bo + q * sk + (p * 16 + j) * sn];
      }
      k.batch_a.push_back(ao);
      k.batch_b.push_back(pit->second * panel_elems);
      k.batch_c.push_back(b * m * nn);
      for (size_t d = batch.size(); d-- > 0;) {
        if (++idx[d] < batch[d]) break;
        idx[d] = 0;
      }
    }
    const int32_t pb = add_packed_constant((cb.name.empty() ? "folded" : cb.name) + ".packed16",
                                           {static_cast<int64_t>(packed_of.size()), panels, kk, 16}, packed);
    k.inputs.push_back(std::move(ea));
    k.inputs.push_back(load(pb));
    push_over_output(std::move(k), n, v);
    p_.kernels.back().label.replace(0, 6, "MatMul.packed");
    return true;
  }

  void emit_gather(const Node& n, Value v) {
    Kernel k = start(n, n.op == Op::kGather ? Kernel::kGather : Kernel::kGatherElements);
    k.inputs.push_back(expr_of(n.inputs[0]));
    k.inputs.push_back(expr_of(n.inputs[1]));
    push_over_output(std::move(k), n, v);
  }

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
  bool gathered_matmul(const Node& n, Value v) {
    const TensorType& ct = n.type();
    const size_t r = ct.shape.size();
    if (ct.dtype != DType::kF32 || r < 2 || opts_.packed_max_rows <= 0) return false;
    const Shape batch(ct.shape.begin(), ct.shape.end() - 2);
    const int64_t nb = numel(batch), m = ct.shape[r - 2], nn = ct.shape[r - 1];
    if (nb < 1 || m < 1 || nn < 1) return false;
    for (int side = 1; side >= 0; --side) {
      // The views from the Gather to the operand, applied to the gathered tensor's layout.
      std::vector<int32_t> chain;
      int32_t gid = n.inputs[static_cast<size_t>(side)].node;
      while (is_view(g_.node(gid).op)) {
        chain.push_back(gid);
        gid = g_.node(gid).inputs[0].node;
      }
      const Node& gn = g_.node(gid);
      if (gn.op != Op::kGather || !deferred_gather_[static_cast<size_t>(gid)] || buffer_of_.count(Value{gid, 0})) continue;
      std::optional<Layout> xl = contiguous_layout(gn.type().shape);
      for (size_t i = chain.size(); xl && i-- > 0;) xl = apply_view(g_.node(chain[i]), *xl);
      if (!xl || xl->shape.size() != r) continue;
      const Shape& ws = g_.type(gn.inputs[0]).shape;
      const int64_t experts = ws[0], R = ws[1], C = ws[2], RC = R * C;
      const int64_t slots = numel(g_.type(gn.inputs[1]).shape);
      const Shape ys = g_.type(n.inputs[static_cast<size_t>(1 - side)]).shape;
      if (experts < 1 || R < 1 || C < 1 || slots > 4096 || ys.size() != r ||
          !std::equal(ys.begin(), ys.end() - 2, batch.begin())) {
        continue;
      }
      // How each batch's matrix sits in the gathered tensor.
      const int64_t xr = xl->shape[r - 2], xc = xl->shape[r - 1], sr = xl->strides[r - 2], sc = xl->strides[r - 1];
      // Row-major: W[e] rows, experts stacked by rows; transposed: W[e]^T, stacked by columns.
      const bool row_major = xc == C && (sc == 1 || C == 1) && xr % R == 0 && (sr == C || xr == 1);
      const bool transposed = !row_major && xr == C && xc % R == 0 && (sr == 1 || C == 1) && (sc == C || xc == 1);
      if (!row_major && !transposed) continue;
      const int64_t per = row_major ? xr / R : xc / R;  // expert matrices per batch
      // Experts stacked along the contracted dimension would be a sum of products: not here.
      if (side == 1 && ((row_major && per != 1) || m > opts_.packed_max_rows)) continue;
      if (side == 0 && (nn != 1 || (transposed && per != 1))) continue;
      std::vector<int64_t> base(static_cast<size_t>(nb));  // each batch's first slot
      {
        std::vector<int64_t> idx(batch.size(), 0);
        bool ok = true;
        for (int64_t b = 0; b < nb && ok; ++b) {
          int64_t off = xl->offset;
          for (size_t d = 0; d < batch.size(); ++d) off += idx[d] * xl->strides[d];
          ok = off % RC == 0 && off / RC + per <= slots;
          base[static_cast<size_t>(b)] = off / RC;
          for (size_t d = batch.size(); d-- > 0;) {
            if (++idx[d] < batch[d]) break;
            idx[d] = 0;
          }
        }
        if (!ok) continue;
      }
      // The constant, seen through views (W[e][i][j] at offset + e*s0 + i*s1 + j*s2).
      const size_t mark = fused_into_.size();
      Expr ew = expr_of(gn.inputs[0]);
      fused_into_.resize(mark);
      if (ew.kind != Expr::kLoad || p_.buffers[static_cast<size_t>(ew.buffer)].region != Region::kConstant) continue;
      Kernel k = start(n, Kernel::kMatMulGathered);
      Expr ey = matmul_operand(n.inputs[static_cast<size_t>(1 - side)]);
      Expr ei = dense_operand(gn.inputs[1]);
      const ConstantData& cw = p_.constants[static_cast<size_t>(p_.buffers[static_cast<size_t>(ew.buffer)].slot)];
      const float* w = reinterpret_cast<const float*>(cw.data()) + ew.layout.offset;
      const int64_t s0 = ew.layout.strides[0], s1 = ew.layout.strides[1], s2 = ew.layout.strides[2];
      // The packed product: B side, m x K times K x N with B_b itself; A side, one row (B_b^T)
      // times A_b^T. Packed as stored (W[e], K = R) or transposed (W[e]^T, K = C).
      const bool stored = (side == 1) == row_major;
      Kernel::Gathered& gg = k.gathered;
      gg.m = side == 1 ? m : 1;
      gg.k = stored ? R : C;
      gg.n = stored ? C : R;
      gg.experts = experts;
      gg.sar = side == 1 ? ey.layout.strides[r - 2] : 0;
      gg.sac = side == 1 ? ey.layout.strides[r - 1] : ey.layout.strides[r - 2];
      gg.ldc = side == 1 ? nn : gg.n;
      const int64_t panels = (gg.n + 15) / 16, panel_elems = panels * gg.k * 16;
      std::vector<float> packed(static_cast<size_t>(experts * panel_elems), 0.0f);
      for (int64_t e = 0; e < experts; ++e) {
        const float* we = w + e * s0;
        float* dst = packed.data() + e * panel_elems;
        for (int64_t p = 0; p < panels; ++p)
          for (int64_t q = 0; q < gg.k; ++q)
            for (int64_t j = 0; j < 16 && p * 16 + j < gg.n; ++j) {
              const int64_t col = p * 16 + j;
              dst[(p * gg.k + q) * 16 + j] = stored ? we[q * s1 + col * s2] : we[col * s1 + q * s2];
            }
      }
      std::vector<int64_t> idx(batch.size(), 0);
      for (int64_t b = 0; b < nb; ++b) {
        int64_t yo = ey.layout.offset;
        for (size_t d = 0; d < batch.size(); ++d) yo += idx[d] * ey.layout.strides[d];
        for (int64_t i = 0; i < per; ++i) {
          k.batch_a.push_back(yo);
          k.batch_b.push_back(ei.layout.offset + base[static_cast<size_t>(b)] + i);
          k.batch_c.push_back(b * m * nn + i * gg.n);
        }
        for (size_t d = batch.size(); d-- > 0;) {
          if (++idx[d] < batch[d]) break;
          idx[d] = 0;
        }
      }
      const int32_t pb = add_packed_constant((cw.name.empty() ? "folded" : cw.name) + (stored ? ".packed16" : ".t.packed16"),
                                             {experts, panels, gg.k, 16}, packed);
      k.attrs.axis = 0;
      k.inputs.push_back(std::move(ey));
      k.inputs.push_back(load(pb));
      k.inputs.push_back(std::move(ei));
      push_over_output(std::move(k), n, v);
      p_.kernels.back().label.replace(0, 6, "MatMul.gathered");
      return true;
    }
    return false;
  }

  void visit(int32_t id) {
    const Node& n = g_.node(id);
    const Value v{id, 0};
    switch (n.op) {
      case Op::kInput: {
        const int32_t s = state_of_input_.at(static_cast<size_t>(n.attrs.index));
        new_buffer(v, s >= 0 ? Region::kState : Region::kInput, s >= 0 ? s : static_cast<int32_t>(n.attrs.index));
        return;
      }
      case Op::kIndexPut: {
        Kernel k = start(n, Kernel::kIndexPut);
        k.shape = g_.type(n.inputs[2]).shape;
        k.in_place = in_place_[static_cast<size_t>(id)];
        k.inputs.push_back(expr_of(n.inputs[0]));
        k.inputs.push_back(expr_of(n.inputs[1]));
        k.inputs.push_back(expr_of(n.inputs[2]));
        int32_t out;
        if (k.in_place) {
          out = buffer_of_.at(n.inputs[0]);
          buffer_of_[v] = out;
        } else {
          out = new_buffer(v, Region::kArena, -1);
        }
        k.outputs.push_back(out);
        k.out_layouts.push_back(contiguous_layout(n.type().shape));
        push(std::move(k), n);
        return;
      }
      case Op::kConstant:
        if (!buffer_of_.count(v)) new_buffer(v, Region::kConstant, static_cast<int32_t>(n.attrs.index));  // or earlier, by conv_post_ops
        return;
      case Op::kMap:
      case Op::kCast:
        if (mat_[static_cast<size_t>(id)] && !absorbed_[static_cast<size_t>(id)]) materialize(v);
        return;
      case Op::kFull:
      case Op::kIota:
      case Op::kPermute:
      case Op::kExpand:
      case Op::kSlice:
      case Op::kReshape:
      case Op::kFlip:
        return;
      case Op::kReduce:
      case Op::kArgReduce: {
        const bool arg = n.op == Op::kArgReduce;
        Kernel k = start(n, arg ? Kernel::kArgReduce : Kernel::kReduce);
        const TensorType& in = g_.type(n.inputs[0]);
        k.shape = in.shape;
        k.inputs.push_back(expr_of(n.inputs[0]));
        std::vector<bool> reduced(in.shape.size(), false);
        if (arg) reduced[static_cast<size_t>(n.attrs.axis)] = true;
        else for (int64_t a : n.attrs.ints) reduced[static_cast<size_t>(a)] = true;
        const int32_t out = new_buffer(v, Region::kArena, -1);
        if (in.numel() == 0 || numel(n.type().shape) == 0) {
          if (!arg && (n.attrs.reduce == ReduceKind::kMax || n.attrs.reduce == ReduceKind::kMin) && numel(n.type().shape) > 0) {
            throw CompileError(g_.describe(id) + ": max/min of an empty tensor has no identity");
          }
          // Empty input: fill with the identity.
          Kernel f = start(n, Kernel::kAssign);
          f.shape = n.type().shape;
          Expr lit;
          lit.kind = Expr::kLiteral;
          lit.dtype = n.type().dtype;
          lit.literal = Scalar::of_int(n.attrs.reduce == ReduceKind::kProd ? 1 : 0);
          f.inputs.push_back(lit);
          f.outputs.push_back(out);
          f.out_layouts.push_back(contiguous_layout(f.shape));
          push(std::move(f), n);
          return;
        }
        // Output addressed in the input's rank with stride 0 on reduced dims.
        Layout ol;
        ol.shape = in.shape;
        const Shape os = contiguous_strides(n.type().shape);
        size_t od = 0;
        for (size_t d = 0; d < in.shape.size(); ++d) {
          if (reduced[d]) {
            ol.strides.push_back(0);
            if (n.attrs.keepdim) ++od;
          } else {
            ol.strides.push_back(os[od++]);
          }
        }
        k.outputs.push_back(out);
        k.out_layouts.push_back(ol);
        push(std::move(k), n);
        return;
      }
      case Op::kScan: {
        Kernel k = start(n, Kernel::kScan);
        k.inputs.push_back(expr_of(n.inputs[0]));
        push_over_output(std::move(k), n, v);
        return;
      }
      case Op::kSoftmax: {
        Kernel k = start(n, Kernel::kSoftmax);
        k.inputs.push_back(expr_of(n.inputs[0]));
        push_over_output(std::move(k), n, v);
        return;
      }
      case Op::kMatMul: {
        if (gathered_matmul(n, v)) return;
        if (packed_matmul(n, v)) return;
        Kernel k = start(n, Kernel::kMatMul);
        k.inputs.push_back(matmul_operand(n.inputs[0]));
        k.inputs.push_back(matmul_operand(n.inputs[1]));
        if (opts_.row_major_constant_b) row_major_constant(&k.inputs.back());
        if (opts_.product_epilogues && n.type().dtype == DType::kF32 && !output_slot_.count(v)) {
          push_with_epilogue(std::move(k), n, v, {});
          return;
        }
        push_over_output(std::move(k), n, v);
        return;
      }
      case Op::kGather:
      case Op::kGatherElements: {
        if (n.op == Op::kGather && deferred_gather_[static_cast<size_t>(id)]) return;  // read in place, or written when read
        emit_gather(n, v);
        return;
      }
      case Op::kConcat: {
        Kernel k = start(n, Kernel::kConcat);
        k.shape = n.type().shape;
        bool cl = false;
        for (Value in : n.inputs) {
          k.inputs.push_back(expr_of(in));
          cl = cl || !strides_for(k.inputs.back(), g_.type(in).shape, v, Want::kAny).empty();
        }
        const int32_t out = new_buffer(v, Region::kArena, -1, cl ? channels_last_strides(k.shape) : std::vector<int64_t>{});
        const Layout full = p_.buffers[static_cast<size_t>(out)].layout();
        int64_t start_at = 0;
        for (Value in : n.inputs) {
          const TensorType& t = g_.type(in);
          Layout l = full;
          l.shape = t.shape;
          l.offset = start_at * full.strides[static_cast<size_t>(n.attrs.axis)];
          start_at += t.shape[static_cast<size_t>(n.attrs.axis)];
          k.outputs.push_back(out);
          k.out_layouts.push_back(l);
        }
        push(std::move(k), n);
        return;
      }
      case Op::kConv: {
        // Float32 on oneDNN: channels-last in and out (a graph output is written row-major);
        // otherwise (float64, no oneDNN) row-major for conv.h.
        Kernel k = start(n, Kernel::kConv);
        const bool cl = opts_.channels_last && n.type().dtype == DType::kF32 && n.type().shape.size() >= 3;
        k.inputs.push_back(cl ? channels_last_operand(n.inputs[0]) : dense_operand(n.inputs[0]));
        k.inputs.push_back(dense_operand(n.inputs[1]));
        const bool epilogue = opts_.product_epilogues && n.type().dtype == DType::kF32;
        if ((!cl && !epilogue) || output_slot_.count(v)) {
          push_over_output(std::move(k), n, v);
          return;
        }
        push_with_epilogue(std::move(k), n, v, cl ? channels_last_strides(n.type().shape) : std::vector<int64_t>{});
        return;
      }
      case Op::kTopK: {
        Kernel k = start(n, Kernel::kTopK);
        k.shape = g_.type(n.inputs[0]).shape;
        k.inputs.push_back(expr_of(n.inputs[0]));
        k.outputs.push_back(new_buffer(Value{id, 0}, Region::kArena, -1));
        k.outputs.push_back(new_buffer(Value{id, 1}, Region::kArena, -1));
        k.out_layouts.push_back(contiguous_layout(n.type(0).shape));
        k.out_layouts.push_back(contiguous_layout(n.type(1).shape));
        push(std::move(k), n);
        return;
      }
      case Op::kLinalg: {
        // LAPACK kernel (chroma/cpu/linalg.h): dense row-major operands, one buffer per output.
        Kernel k = start(n, Kernel::kLinalg);
        k.shape = g_.type(n.inputs[0]).shape;
        for (Value in : n.inputs) k.inputs.push_back(dense_operand(in));
        for (int32_t i = 0; i < static_cast<int32_t>(n.types.size()); ++i) {
          k.outputs.push_back(new_buffer(Value{id, i}, Region::kArena, -1));
          k.out_layouts.push_back(contiguous_layout(n.type(i).shape));
        }
        push(std::move(k), n);
        return;
      }
      case Op::kCount:
        break;
    }
    throw CompileError("internal: cannot lower " + g_.describe(id));
  }

  // Outputs not written in place by their producer (inputs, constants, views, repeats) get
  // a copy kernel.
  void finish_outputs() {
    size_t user_outputs = 0;
    for (int32_t s : state_of_output_) user_outputs += s < 0 ? 1 : 0;
    p_.outputs.assign(user_outputs, -1);
    for (const Buffer& b : p_.buffers) {
      if (b.region == Region::kOutput) p_.outputs[static_cast<size_t>(b.slot)] = static_cast<int32_t>(&b - p_.buffers.data());
    }
    for (size_t k = 0; k < user_outputs; ++k) {
      if (p_.outputs[k] >= 0) continue;
      const Value v = g_.outputs[k];
      const Node& n = g_.node(v);
      Kernel kr = start(n, Kernel::kAssign);
      kr.shape = g_.type(v).shape;
      kr.inputs.push_back(expr_of(v));
      Buffer b;
      b.region = Region::kOutput;
      b.slot = static_cast<int32_t>(k);
      b.type = g_.type(v);
      b.name = n.name;
      p_.buffers.push_back(b);
      const auto id = static_cast<int32_t>(p_.buffers.size() - 1);
      kr.outputs.push_back(id);
      kr.out_layouts.push_back(contiguous_layout(kr.shape));
      p_.outputs[k] = id;
      push(std::move(kr), n);
      p_.kernels.back().label = "Copy <- " + p_.kernels.back().label;
    }
    finish_states();
    for (const Buffer& b : p_.buffers) {
      if (b.region == Region::kInput) p_.inputs.push_back(static_cast<int32_t>(&b - p_.buffers.data()));
    }
    std::sort(p_.inputs.begin(), p_.inputs.end(), [&](int32_t a, int32_t b) {
      return p_.buffers[static_cast<size_t>(a)].slot < p_.buffers[static_cast<size_t>(b)].slot;
    });
  }

  // New state values not written in place are copied into their state after everything
  // else has run (so every reader saw the old value); a value that is itself some state's
  // buffer is first copied out, so updates like a swap read the old contents.
  void finish_states() {
    std::vector<std::pair<int32_t, int32_t>> copies;  // (state buffer, value buffer)
    std::vector<std::string> names;
    for (size_t s = 0; s < g_.states.size(); ++s) {
      const StateBinding& st = g_.states[s];
      if (st.output < 0) continue;
      const Value v = g_.outputs[static_cast<size_t>(st.output)];
      const int32_t sbuf = buffer_of_.at(Value{g_.inputs[static_cast<size_t>(st.input)].node, 0});
      auto it = buffer_of_.find(v);
      if (it != buffer_of_.end() && it->second == sbuf) continue;  // in place, or unchanged
      if (it == buffer_of_.end() || p_.buffers[static_cast<size_t>(it->second)].region == Region::kState) {
        Kernel k = start(g_.node(v), Kernel::kAssign);
        k.shape = g_.type(v).shape;
        k.inputs.push_back(expr_of(v));
        k.outputs.push_back(new_buffer_of(g_.type(v), Region::kArena, g_.node(v).name));
        k.out_layouts.push_back(contiguous_layout(k.shape));
        push(std::move(k), g_.node(v));
        p_.kernels.back().label = "Copy <- " + p_.kernels.back().label;
        copies.emplace_back(sbuf, p_.kernels.back().outputs[0]);
      } else {
        copies.emplace_back(sbuf, it->second);
      }
      names.push_back(st.name);
    }
    for (size_t c = 0; c < copies.size(); ++c) {
      const auto [sbuf, vbuf] = copies[c];
      Kernel k;
      k.kind = Kernel::kAssign;
      k.shape = p_.buffers[static_cast<size_t>(sbuf)].type.shape;
      k.inputs.push_back(load(vbuf));
      k.outputs.push_back(sbuf);
      k.out_layouts.push_back(contiguous_layout(k.shape));
      k.label = "StateUpdate " + names[c];
      k.name = names[c];
      p_.kernels.push_back(std::move(k));
    }
  }

  int32_t new_buffer_of(const TensorType& t, Region r, const std::string& name) {
    Buffer b;
    b.type = t;
    b.region = r;
    b.name = name;
    p_.buffers.push_back(b);
    return static_cast<int32_t>(p_.buffers.size() - 1);
  }

  static void reads(const Expr& e, std::vector<int32_t>& out) {
    if (e.kind == Expr::kLoad) out.push_back(e.buffer);
    for (const Expr& c : e.children) reads(c, out);
  }

  void plan_memory() {
    for (size_t ki = 0; ki < p_.kernels.size(); ++ki) {
      const Kernel& k = p_.kernels[ki];
      const auto t = static_cast<int32_t>(ki);
      for (int32_t b : k.outputs) {
        Buffer& buf = p_.buffers[static_cast<size_t>(b)];
        if (buf.first < 0) buf.first = t;
        buf.last = std::max(buf.last, t);
      }
      std::vector<int32_t> rs;
      for (const Expr& e : k.inputs) reads(e, rs);
      for (int32_t b : rs) {
        Buffer& buf = p_.buffers[static_cast<size_t>(b)];
        buf.last = std::max(buf.last, t);
      }
    }
    memory::ArenaPlanner planner(opts_.arena_alignment);
    std::vector<int32_t> ids;
    for (size_t i = 0; i < p_.buffers.size(); ++i) {
      const Buffer& b = p_.buffers[i];
      if (b.region != Region::kArena) continue;
      planner.add_buffer(opts_.device_storage ? device_storage_bytes(b.type.dtype, b.type.numel()) : b.type.nbytes(), b.first, b.last);
      ids.push_back(static_cast<int32_t>(i));
    }
    planner.plan();
    std::string why;
    if (!planner.check(&why)) throw CompileError("internal: memory plan invalid: " + why);
    for (size_t j = 0; j < ids.size(); ++j) p_.buffers[static_cast<size_t>(ids[j])].offset = planner.offset(static_cast<int>(j));
    p_.arena_bytes = planner.arena_size();
    p_.arena_lower_bound = planner.lower_bound();
    p_.temporaries_bytes = planner.total_bytes();
    p_.plan_description = planner.describe();
  }
};

}  // namespace

Program lower(const Graph& g, const LowerOptions& opts) { return Lowerer(g, opts).run(); }

const char* kernel_kind(Kernel::Kind k) {
  static const char* names[] = {"assign", "reduce",   "arg_reduce", "matmul",        "gather",    "gather_elements",
                                "concat", "topk",     "softmax",    "matmul_packed", "index_put", "scan",
                                "conv",   "linalg",   "matmul_gathered"};
  return names[k];
}

std::string describe(const Program& p) {
  std::ostringstream o;
  o << "kernels: " << p.kernels.size() << "\n";
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const Kernel& k = p.kernels[i];
    o << "  k" << i << ": " << k.label << " -> ";
    for (size_t j = 0; j < k.outputs.size(); ++j) {
      const Buffer& b = p.buffers[static_cast<size_t>(k.outputs[j])];
      if (j && k.outputs[j] == k.outputs[j - 1]) continue;
      o << (j ? ", " : "") << b.type.str();
    }
    if (!k.source.empty()) o << "   (" << k.source << ")";
    o << "\n";
  }
  o << "memory plan: arena " << p.arena_bytes << " B for " << p.temporaries_bytes << " B of temporaries (lower bound "
    << p.arena_lower_bound << " B)\n";
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const Buffer& b = p.buffers[i];
    if (b.region != Region::kArena) continue;
    o << "  buf" << i << " " << b.type.str() << (b.channels_last() ? " channels-last" : "") << " offset " << b.offset
      << " size " << b.type.nbytes() << " kernels [" << b.first << ", " << b.last << "]" << (b.name.empty() ? "" : "  " + b.name)
      << "\n";
  }
  o << p.plan_description;
  return o.str();
}

}  // namespace chroma

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
#include "lower/lowerer.h"

#include <numeric>

namespace chroma::lowering {

Program Lowerer::run() {
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

void Lowerer::decide() {
  // Effective readers, views transparent: computed backwards.
  std::vector<int> readers(g_.size(), 0);
  std::vector<std::vector<int32_t>>& consumers = consumers_;
  consumers.assign(g_.size(), {});
  for (size_t i = 0; i < g_.size(); ++i) {
    for (Value v : g_.nodes()[i].inputs) consumers[static_cast<size_t>(v.node)].push_back(static_cast<int32_t>(i));
  }
  absorbed_.assign(g_.size(), false);
  // The role "unembedding" of the weights policy: products whose value reaches an output
  // through views and elementwise operations only (the logits of a language model).
  final_.assign(g_.size(), false);
  for (Value v : g_.outputs) final_[static_cast<size_t>(v.node)] = true;
  for (size_t i = g_.size(); i-- > 0;) {
    const Node& n = g_.nodes()[i];
    if (!final_[i] || !(is_view(n.op) || is_elementwise(n.op))) continue;
    for (Value v : n.inputs) final_[static_cast<size_t>(v.node)] = true;
  }
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
    // The stack: a float32 constant, or the model's bfloat16 one widened (weight_source).
    const int32_t ws = source_of(n.inputs[0].node);
    if ((g_.node(ws).op != Op::kConstant && !widened_bf16_weight(ws)) || wt.dtype != DType::kF32 || wt.shape.size() != 3) continue;
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
    // The model's bfloat16 weight widened (fold_constants keeps that Cast on the CPU only when
    // products read it): never written out, however many products read it (weights with the
    // same contents are one constant: a model's copies of one layer, tied weights); each
    // product packs the 16-bit values (weight_source).
    if (opts_.packed_max_rows > 0 && widened_bf16_weight(static_cast<int32_t>(i)) &&
        !output_slot_.count(Value{static_cast<int32_t>(i), 0})) {
      continue;
    }
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

bool Lowerer::cheap_to_repeat(size_t i, int readers) const {
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

int32_t Lowerer::source_of(int32_t id) const {
  while (is_view(g_.node(id).op)) id = g_.node(id).inputs[0].node;
  return id;
}

int32_t Lowerer::new_buffer(Value v, Region r, int32_t slot, std::vector<int64_t> strides) {
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

int32_t Lowerer::relayout_constant(const Expr& src, Value v) {
  if (auto it = buffer_of_.find(v); it != buffer_of_.end()) return it->second;
  const ConstantData& c = p_.constants[static_cast<size_t>(p_.buffers[static_cast<size_t>(src.buffer)].slot)];
  const Shape& shape = src.layout.shape;
  std::vector<size_t> order(shape.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const int32_t b = add_packed_bytes(weight_name(c) + ".relayout", TensorType{src.dtype, shape},
                                     gather_strided(c.data(), dtype_size(src.dtype), src.layout, shape, order));
  buffer_of_[v] = b;
  return b;
}

std::string Lowerer::weight_name(const ConstantData& c) {
  std::string n = c.name.empty() ? "folded" : c.name;
  constexpr std::string_view suffix = ".relayout";
  if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) n.resize(n.size() - suffix.size());
  return n;
}

Expr Lowerer::load(int32_t buf) {
  Expr e;
  e.kind = Expr::kLoad;
  e.buffer = buf;
  e.dtype = p_.buffers[static_cast<size_t>(buf)].type.dtype;
  e.layout = p_.buffers[static_cast<size_t>(buf)].layout();
  return e;
}

Expr Lowerer::expr_of(Value v) {
  auto it = buffer_of_.find(v);
  if (it != buffer_of_.end()) return load(it->second);
  return compute(v);
}

bool Lowerer::map_leaves(Expr& e, const Node& view) {
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

Expr Lowerer::compute(Value v) {
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
      // The source layout cannot express this view. A constant seen through views (a weight
      // permuted, then reshaped: einsum's operands) is laid out contiguously once, at compile
      // time, rather than copied by a kernel on every call.
      if (src.kind == Expr::kLoad && fused_into_.size() == mark &&
          p_.buffers[static_cast<size_t>(src.buffer)].region == Region::kConstant) {
        Expr c = load(relayout_constant(src, n.inputs[0]));
        if (map_leaves(c, n)) return c;
      }
      // Otherwise give the source its own buffer.
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

Kernel Lowerer::start(const Node& n, Kernel::Kind k) {
  Kernel kr;
  kr.kind = k;
  kr.attrs = n.attrs;
  kr.name = n.name;
  kr.source = n.source;
  fused_into_.clear();
  return kr;
}

void Lowerer::push(Kernel k, const Node& n) {
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

void Lowerer::push_over_output(Kernel k, const Node& n, Value v) {
  k.shape = n.type().shape;
  k.outputs.push_back(new_buffer(v, Region::kArena, -1));
  k.out_layouts.push_back(contiguous_layout(k.shape));
  push(std::move(k), n);
}

void Lowerer::materialize(Value v, Want want) {
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

void Lowerer::visit(int32_t id) {
  const Node& n = g_.node(id);
  const Value v{id, 0};
  switch (n.op) {
    case Op::kInput: {
      const int32_t s = state_of_input_.at(static_cast<size_t>(n.attrs.index));
      new_buffer(v, s >= 0 ? Region::kState : Region::kInput, s >= 0 ? s : static_cast<int32_t>(n.attrs.index));
      return;
    }
    case Op::kIndexPut:
      visit_index_put(n, v);
      return;
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
    case Op::kArgReduce:
      visit_reduce(n, v);
      return;
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
    case Op::kMatMul:
      visit_matmul(n, v);
      return;
    case Op::kAttention: {
      // One kernel (chroma/cpu/attention.h): the operands where BLAS can address them, the
      // bias as an expression over the scores, evaluated a block of scores at a time.
      // attrs.dtype kBF16: the kernel multiplies as bfloat16 (attention.h): q, kt and v all
      // hold bfloat16 values (a bfloat16 model's attention), or the weights policy asks for it
      // (attention=bf16).
      Kernel k = start(n, Kernel::kAttention);
      const bool bf16 = opts_.weights.attention_bf16 ||
                        (bf16_valued(n.inputs[0]) && bf16_valued(n.inputs[1]) && bf16_valued(n.inputs[2]));
      k.attrs.dtype = bf16 ? DType::kBF16 : DType::kF32;
      for (size_t i = 0; i < 3; ++i) k.inputs.push_back(matmul_operand(n.inputs[i]));
      if (n.inputs.size() == 4) k.inputs.push_back(expr_of(n.inputs[3]));
      push_over_output(std::move(k), n, v);
      return;
    }
    case Op::kGather:
    case Op::kGatherElements: {
      if (n.op == Op::kGather && deferred_gather_[static_cast<size_t>(id)]) return;  // read in place, or written when read
      emit_gather(n, v);
      return;
    }
    case Op::kConcat:
      visit_concat(n, v);
      return;
    case Op::kConv:
      visit_conv(n, v);
      return;
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

void Lowerer::visit_index_put(const Node& n, Value v) {
  Kernel k = start(n, Kernel::kIndexPut);
  k.shape = g_.type(n.inputs[2]).shape;
  k.index_put().in_place = in_place_[static_cast<size_t>(v.node)];
  k.inputs.push_back(expr_of(n.inputs[0]));
  k.inputs.push_back(expr_of(n.inputs[1]));
  k.inputs.push_back(expr_of(n.inputs[2]));
  int32_t out;
  if (k.index_put().in_place) {
    out = buffer_of_.at(n.inputs[0]);
    buffer_of_[v] = out;
  } else {
    out = new_buffer(v, Region::kArena, -1);
  }
  k.outputs.push_back(out);
  k.out_layouts.push_back(contiguous_layout(n.type().shape));
  push(std::move(k), n);
}

void Lowerer::visit_reduce(const Node& n, Value v) {
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
      throw CompileError(g_.describe(v.node) + ": max/min of an empty tensor has no identity");
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
}

void Lowerer::visit_concat(const Node& n, Value v) {
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
}

void Lowerer::finish_outputs() {
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

void Lowerer::finish_states() {
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

int32_t Lowerer::new_buffer_of(const TensorType& t, Region r, const std::string& name) {
  Buffer b;
  b.type = t;
  b.region = r;
  b.name = name;
  p_.buffers.push_back(b);
  return static_cast<int32_t>(p_.buffers.size() - 1);
}

void Lowerer::reads(const Expr& e, std::vector<int32_t>& out) {
  if (e.kind == Expr::kLoad) out.push_back(e.buffer);
  for (const Expr& c : e.children) reads(c, out);
}

void Lowerer::plan_memory() {
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

}  // namespace chroma::lowering

namespace chroma {

using lowering::Lowerer;

Program lower(const Graph& g, const LowerOptions& opts) { return Lowerer(g, opts).run(); }

}  // namespace chroma

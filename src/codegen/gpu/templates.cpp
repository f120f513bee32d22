// Kernel templates (DESIGN.md "The GPU generator", layer B): one per lowered kernel kind,
// written once over the kernel IR. Each reads the lowered kernel's fused expressions through
// `eval` (so any fused tree, view or broadcast is read in place) and writes through the
// output layouts; none knows the dialect.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "codegen/gpu/elementwise.h"
#include "codegen/gpu/gpu_codegen.h"

namespace chroma::gpu {

namespace {

int64_t pow2_at_least(int64_t n, int64_t lo, int64_t hi) {
  int64_t p = lo;
  while (p < n && p < hi) p *= 2;
  return p;
}

// One dispatch under construction: the kernel IR plus the per-dispatch values its params and
// slots stand for.
class KB {
 public:
  KB(const Program& p, const std::function<Placement(int32_t)>& place, std::string name, int wg, int dispatch_index,
     bool subgroups)
      : p_(p), place_(place), dispatch_index_(dispatch_index), subgroups_(subgroups) {
    k.name = std::move(name);
    k.workgroup_size = wg;
  }

  Kernel k;
  std::vector<uint32_t> params;
  std::vector<Placement> slots;

  Block body() { return Block(&k.body, &counter_); }

  int slot(const Placement& pl, bool write) {
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] == pl) {
        k.slots[i].writable = k.slots[i].writable || write;
        return static_cast<int>(i);
      }
    }
    slots.push_back(pl);
    k.slots.push_back(Slot{write});
    return static_cast<int>(slots.size() - 1);
  }

  Ex add_param(int64_t value) {
    if (value < 0 || value > 0xffffffffll) throw Unsupported("a buffer offset does not fit in 32 bits");
    params.push_back(static_cast<uint32_t>(value));
    k.params = static_cast<int>(params.size());
    return param(k.params - 1);
  }

  // (slot, base word) of a buffer at an element offset; one param per (site, buffer).
  std::pair<int, Ex> base(const void* site, int32_t buffer, int64_t elem_offset, bool write) {
    const Placement pl = place_(buffer);
    const int s = slot(pl, write);
    const auto key = std::make_pair(site, buffer);
    auto it = bases_.find(key);
    if (it != bases_.end()) return {s, it->second};
    // in elements of the buffer's storage from the slot's start (packed types: bytes or halves)
    const int64_t per_word = 4 / device_element_bytes(this->buffer(buffer).type.dtype);
    const int64_t at = pl.word * per_word + elem_offset;
    if (per_word > 1 && at > INT32_MAX) throw Unsupported("a packed tensor lies beyond the first 2 GiB of its buffer");
    Ex b = add_param(at);
    bases_[key] = b;
    return {s, b};
  }

  const Buffer& buffer(int32_t id) const { return p_.buffers[static_cast<size_t>(id)]; }

  // Element address: base + sum coords * strides (unit and zero strides folded away).
  static Ex address(const Ex& base, const std::vector<int64_t>& strides, const std::vector<Ex>& coords) {
    Ex a = base;
    for (size_t d = 0; d < strides.size() && d < coords.size(); ++d) {
      if (strides[d] == 0 || is_lit(coords[d], 0)) continue;
      a = add(a, strides[d] == 1 ? coords[d] : mul(coords[d], lit_i(strides[d])));
    }
    return a;
  }

  static Ex from_word(DType t, const Ex& w) {
    switch (compute_type(t)) {
      case Ty::kF32: return bitcast(Ty::kF32, w);
      case Ty::kBool: return bin("!=", w, lit_u(0));
      default: return bitcast(Ty::kI32, w);
    }
  }
  static Ex to_word(DType t, const Ex& v) {
    if (v->ty == Ty::kBool) return convert(Ty::kU32, v);
    (void)t;
    return bitcast(Ty::kU32, v);
  }

  // The value of a fused expression at `coords` (one coordinate per dimension of its shape),
  // in its compute type.
  Ex eval(Block& b, const Expr& e, const std::vector<Ex>& coords) {
    switch (e.kind) {
      case Expr::kLoad: {
        if (e.buffer == result_buffer_ && result_) return result_;
        auto [s, base_ex] = base(&e, e.buffer, e.layout.offset, false);
        const Ex a = address(base_ex, e.layout.strides, coords);
        const int eb = device_element_bytes(e.dtype);
        if (eb == 4) return from_word(e.dtype, load_word(s, a));
        const auto [word, shift] = packed_position(b, a, eb);
        return b.let(from_bits(e.dtype, bin(">>", load_word(s, word), shift)));
      }
      case Expr::kLiteral: {
        const Ty t = compute_type(e.dtype);
        if (t == Ty::kI32) {
          const int64_t v = narrow_int64(e.literal.is_int ? e.literal.i : static_cast<int64_t>(e.literal.f));
          if (v < INT32_MIN || v > INT32_MAX) {
            throw Unsupported("the " + std::string(dtype_name(e.dtype)) + " literal " + std::to_string(v) +
                              " does not fit in 32 bits (GPU integers are narrowed to i32)");
          }
          return lit_i(v);
        }
        return lit(t, e.literal.as_double());
      }
      case Expr::kIota: {
        const Ty t = compute_type(e.dtype);
        if (t == Ty::kF32) {
          Ex v = lit_f(e.iota_base.as_double() + e.affine.offset);
          for (size_t d = 0; d < e.affine.strides.size() && d < coords.size(); ++d) {
            if (e.affine.strides[d] == 0) continue;
            v = add(v, mul(convert(Ty::kF32, coords[d]), lit_f(e.affine.strides[d])));
          }
          return b.let(v);
        }
        const int64_t base_v = (e.iota_base.is_int ? e.iota_base.i : static_cast<int64_t>(e.iota_base.f)) +
                               static_cast<int64_t>(e.affine.offset);
        std::vector<int64_t> st;
        for (double c : e.affine.strides) st.push_back(static_cast<int64_t>(c));
        Ex v = address(lit_i(base_v), st, coords);
        return t == Ty::kBool ? bin("!=", v, lit_i(0)) : b.let(wrap_to(e.dtype, v));
      }
      case Expr::kCast: {
        const Expr& c = e.children[0];
        return b.let(cast_value(eval(b, c, coords), c.dtype, e.dtype));
      }
      case Expr::kMap: {
        std::vector<Ex> xs;
        std::vector<DType> ts;
        std::vector<const Expr*> ops;
        for (const Expr& c : e.children) {
          xs.push_back(b.let(eval(b, c, coords)));
          ts.push_back(c.dtype);
          ops.push_back(&c);
        }
        Ex r = map_op(b, e.ew, e.dtype, ts, xs, ops);
        if (compute_type(e.dtype) == Ty::kI32) r = wrap_to(e.dtype, r);
        return b.let(r);
      }
    }
    throw Unsupported("unknown expression kind");
  }

  void store(Block& b, const void* site, int32_t buffer, const Layout& l, const std::vector<Ex>& coords, Ex v) {
    auto [s, base_ex] = base(site, buffer, l.offset, true);
    const DType t = this->buffer(buffer).type.dtype;
    const Ex a = address(base_ex, l.strides, coords);
    const int eb = device_element_bytes(t);
    if (eb == 4) {
      b.store(s, a, to_word(t, v));
      return;
    }
    // A packed element: replace its bits of the word (atomically: neighbours may be written
    // by other invocations at the same time).
    const auto [word, shift] = packed_position(b, a, eb);
    const Ex ones = lit_u(eb == 1 ? 0xffu : 0xffffu);
    b.store_bits(s, word, b.let(bin("<<", bin("&", to_word(t, v), ones), shift)), b.let(bin("<<", ones, shift)));
    k.slots[static_cast<size_t>(s)].atomic = true;
  }

  // The word holding the packed element at `a` (counted in elements of `eb` bytes) and the
  // element's bit offset in it.
  static std::pair<Ex, Ex> packed_position(Block& b, const Ex& a, int eb) {
    const Ex at = b.let(a);
    const int per_word = 4 / eb;
    const Ex word = b.let(bin(">>", at, lit_i(per_word == 4 ? 2 : 1)));
    const Ex shift = b.let(bin("<<", bin("&", at, lit_i(per_word - 1)), lit_i(eb == 1 ? 3 : 4)));
    return {word, shift};
  }

  // A packed element's value from its bits at the bottom of a word (higher bits: neighbours).
  static Ex from_bits(DType t, const Ex& w) {
    switch (t) {
      case DType::kBool: return bin("!=", bin("&", w, lit_u(0xff)), lit_u(0));
      case DType::kU8: return bitcast(Ty::kI32, bin("&", w, lit_u(0xff)));
      case DType::kI8: return bin(">>", bitcast(Ty::kI32, bin("<<", w, lit_i(24))), lit_i(24));  // sign-extended
      case DType::kI16: return bin(">>", bitcast(Ty::kI32, bin("<<", w, lit_i(16))), lit_i(16));
      default: throw Unsupported("internal: a packed load of a 32-bit type");
    }
  }

  // Stores a product's result `acc` at `coords` of its output, through the kernel's
  // epilogue when it has one (its loads of the output buffer stand for `acc`).
  void store_result(Block& b, const chroma::Kernel& lk, const std::vector<Ex>& coords, const Ex& acc) {
    Ex v = acc;
    if (lk.epilogue >= 0) {
      result_buffer_ = lk.outputs[0];
      result_ = acc;
      v = eval(b, lk.inputs[static_cast<size_t>(lk.epilogue)], coords);
      result_buffer_ = -1;
      result_ = nullptr;
    }
    store(b, &lk, lk.outputs[0], lk.out_layouts[0], coords, v);
  }

  // Sets the status block (arena words 0-4) when `bad`: the dispatch's index, the value, the
  // size of the dimension it indexes and that dimension.
  void flag_bad_index(Block& b, const Ex& bad, const Ex& value, int64_t dim_size, int64_t axis) {
    Placement arena;
    arena.where = Placement::kArena;
    const int s = slot(arena, true);
    if (!dispatch_param_) dispatch_param_ = add_param(dispatch_index_ + 1);
    // only the first failing dispatch reports (dispatches run in order; within one, every
    // writer stores this dispatch's index)
    b.if_(bin("&&", bad, bin("==", load_word(s, lit_i(0)), lit_u(0))), [&](Block& t) {
      t.store(s, lit_i(0), lit_u(1));
      t.store(s, lit_i(1), bitcast(Ty::kU32, dispatch_param_));
      t.store(s, lit_i(2), bitcast(Ty::kU32, value));
      t.store(s, lit_i(3), lit_u(static_cast<uint64_t>(dim_size)));
      t.store(s, lit_i(4), lit_u(static_cast<uint64_t>(axis)));
    });
  }

  // Row-major coordinates of `linear` in `shape` (extent-1 dimensions are 0).
  static std::vector<Ex> coords_of(Block& b, const Ex& linear, const Shape& shape) {
    std::vector<Ex> c(shape.size());
    size_t outer = shape.size();
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] != 1) {
        outer = d;
        break;
      }
    }
    int64_t suffix = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      if (shape[d] == 1) {
        c[d] = lit_i(0);
        continue;
      }
      Ex q = suffix == 1 ? linear : bin("/", linear, lit_i(suffix));
      c[d] = b.let(d == outer ? q : bin("%", q, lit_i(shape[d])), "c");
      suffix *= shape[d];
    }
    return c;
  }

  // The invocation's linear index over `total` elements, `wg * W + lid`; the body runs when it
  // is in range.
  template <class F> void per_element(int64_t total, F body_fn) {
    if (total >= (1ll << 31)) throw Unsupported("more than 2^31 elements in one kernel");
    k.workgroups = std::max<int64_t>(1, (total + k.workgroup_size - 1) / k.workgroup_size);
    Block b = body();
    const Ex i = b.let(add(mul(var("wg", Ty::kI32), lit_i(k.workgroup_size)), var("lid", Ty::kI32)), "i");
    b.if_(bin("<", i, lit_i(total)), [&](Block& in) { body_fn(in, i); });
  }

  // Combines every invocation's `v` over the workgroup through shared memory; returns the
  // result, the same in every invocation. `subgroup_op` (e.g. subgroupAdd), when the kernel
  // is built with subgroup operations: each subgroup combines its values in registers, then
  // every invocation folds the subgroups' partials (workgroup size / subgroup size of them)
  // in order, starting from `init` (the combiner's identity).
  Ex tree(Block& b, const Ex& v, const std::string& name, const std::function<Ex(Block&, Ex, Ex)>& combine,
          const char* subgroup_op = nullptr, const Ex& init = nullptr) {
    const int w = k.workgroup_size;
    if (subgroups_ && subgroup_op && init) {
      k.subgroups = true;
      const Ex sg_size = var("sg_size", Ty::kI32), sg_lane = var("sg_lane", Ty::kI32);
      add_shared(name, v->ty, w);
      const Ex r = b.let(call(subgroup_op, v->ty, {v}), "sg");
      b.if_(bin("==", sg_lane, lit_i(0)),
            [&](Block& t) { t.shared_store(name, bin("/", var("lid", Ty::kI32), sg_size), r); });
      b.barrier();
      const Ex acc = b.mut(v->ty, init, "r");
      // a subgroup is taken to be the invocations lid / sg_size (consecutive local indices,
      // as Vulkan, D3D12 and Metal lay out one-dimensional workgroups; WGSL does not say),
      // and may be wider than the workgroup: ceil(W / sg_size) partials
      b.loop("g", lit_i(0), add(bin("/", lit_i(w - 1), sg_size), lit_i(1)), lit_i(1), [&](Block& l, const Ex& g) {
        l.assign(acc, combine(l, acc, l.let(load_array(Space::kShared, name, v->ty, g))));
      });
      b.barrier();  // the array may be reused after this
      return acc;
    }
    add_shared(name, v->ty, w);
    b.shared_store(name, var("lid", Ty::kI32), v);
    b.barrier();
    for (int s = w / 2; s > 0; s /= 2) {
      b.if_(bin("<", var("lid", Ty::kI32), lit_i(s)), [&](Block& t) {
        const Ex x = t.let(load_array(Space::kShared, name, v->ty, var("lid", Ty::kI32)));
        const Ex y = t.let(load_array(Space::kShared, name, v->ty, add(var("lid", Ty::kI32), lit_i(s))));
        t.shared_store(name, var("lid", Ty::kI32), combine(t, x, y));
      });
      b.barrier();
    }
    const Ex r = b.let(load_array(Space::kShared, name, v->ty, lit_i(0)), "r");
    b.barrier();  // the array may be reused after this
    return r;
  }

  void add_shared(const std::string& name, Ty t, int64_t count) {
    for (const SharedArray& a : k.shared) {
      if (a.name == name) return;
    }
    k.shared.push_back(SharedArray{name, t, count});
  }

 private:
  const Program& p_;
  const std::function<Placement(int32_t)>& place_;
  int dispatch_index_;
  int counter_ = 0;
  std::map<std::pair<const void*, int32_t>, Ex> bases_;
  Ex dispatch_param_;
  bool subgroups_;
  int32_t result_buffer_ = -1;  // store_result: the output buffer, read as `result_`
  Ex result_;
};

// The split of an iteration space into kept (output) and reduced dimensions.
struct Split {
  Shape kept, reduced;
  std::vector<size_t> kept_dims, reduced_dims;
  size_t rank = 0;
  int64_t outputs() const { return numel(kept); }
  int64_t extent() const { return numel(reduced); }
};

Split split(const Shape& shape, const std::vector<bool>& mask) {
  Split s;
  s.rank = shape.size();
  for (size_t d = 0; d < shape.size(); ++d) {
    if (mask[d]) {
      s.reduced.push_back(shape[d]);
      s.reduced_dims.push_back(d);
    } else {
      s.kept.push_back(shape[d]);
      s.kept_dims.push_back(d);
    }
  }
  return s;
}

std::vector<Ex> merge(Block& b, const Split& s, const Ex& o, const Ex& r) {
  std::vector<Ex> c(s.rank);
  const std::vector<Ex> ko = KB::coords_of(b, o, s.kept), kr = KB::coords_of(b, r, s.reduced);
  for (size_t i = 0; i < s.kept_dims.size(); ++i) c[s.kept_dims[i]] = ko[i];
  for (size_t i = 0; i < s.reduced_dims.size(); ++i) c[s.reduced_dims[i]] = kr[i];
  return c;
}

EwOp combine_op(ReduceKind r) {
  switch (r) {
    case ReduceKind::kSum: return EwOp::k_add;
    case ReduceKind::kProd: return EwOp::k_mul;
    case ReduceKind::kMax: return EwOp::k_maximum;
    case ReduceKind::kMin: return EwOp::k_minimum;
  }
  return EwOp::k_add;
}

Ex identity(ReduceKind r, Ty t) {
  const double inf = std::numeric_limits<double>::infinity();
  switch (r) {
    case ReduceKind::kSum: return lit(t, 0);
    case ReduceKind::kProd: return lit(t, 1);
    case ReduceKind::kMax: return t == Ty::kF32 ? lit_f(-inf) : t == Ty::kBool ? lit_b(false) : lit_i(INT32_MIN);
    case ReduceKind::kMin: return t == Ty::kF32 ? lit_f(inf) : t == Ty::kBool ? lit_b(true) : lit_i(INT32_MAX);
  }
  return lit(t, 0);
}

std::function<Ex(Block&, Ex, Ex)> combiner(ReduceKind r, DType t) {
  return [r, t](Block& b, Ex x, Ex y) {
    x = b.let(x);  // the NaN-propagating max/min read each operand more than once
    y = b.let(y);
    Ex v = map_op(b, combine_op(r), t, {t, t}, {x, y}, {nullptr, nullptr});
    return compute_type(t) == Ty::kI32 ? wrap_to(t, v) : v;
  };
}

// ---- templates ---------------------------------------------------------------------------

void t_assign(KB& kb, const chroma::Kernel& lk) {
  const Expr& e = lk.inputs[0];
  kb.per_element(numel(lk.shape), [&](Block& b, const Ex& i) {
    const std::vector<Ex> c = KB::coords_of(b, i, lk.shape);
    kb.store(b, &lk.out_layouts[0], lk.outputs[0], lk.out_layouts[0], c, kb.eval(b, e, c));
  });
}

void t_concat(KB& kb, const chroma::Kernel& lk) {
  int64_t total = 0;
  std::vector<int64_t> ends;
  for (const Layout& l : lk.out_layouts) ends.push_back(total += numel(l.shape));
  kb.per_element(total, [&](Block& b, const Ex& i) {
    // if (i < end0) part 0 else if (i < end1) part 1 ...
    std::function<void(Block&, size_t)> part = [&](Block& bb, size_t p) {
      if (p >= lk.inputs.size()) return;
      if (numel(lk.out_layouts[p].shape) == 0) return part(bb, p + 1);
      const int64_t start = ends[p] - numel(lk.out_layouts[p].shape);
      auto body = [&](Block& in) {
        const Ex local = in.let(start ? bin("-", i, lit_i(start)) : i);
        const std::vector<Ex> c = KB::coords_of(in, local, lk.out_layouts[p].shape);
        kb.store(in, &lk.out_layouts[p], lk.outputs[p], lk.out_layouts[p], c, kb.eval(in, lk.inputs[p], c));
      };
      if (p + 1 == lk.inputs.size()) return body(bb);
      bb.if_else(bin("<", i, lit_i(ends[p])), body, [&](Block& rest) { part(rest, p + 1); });
    };
    part(b, 0);
  });
}

std::vector<bool> reduced_mask(const chroma::Kernel& lk) {
  std::vector<bool> mask(lk.shape.size(), false);
  if (lk.kind == chroma::Kernel::kReduce) {
    for (int64_t a : lk.attrs.ints) mask[static_cast<size_t>(a)] = true;
  } else {
    mask[static_cast<size_t>(lk.attrs.axis)] = true;
  }
  return mask;
}

void t_reduce(KB& kb, const chroma::Kernel& lk, const Program& p) {
  const Split s = split(lk.shape, reduced_mask(lk));
  const DType ot = p.buffers[static_cast<size_t>(lk.outputs[0])].type.dtype;
  const Ty t = compute_type(ot);
  const Expr& e = lk.inputs[0];
  const auto comb = combiner(lk.attrs.reduce, ot);
  const int64_t R = s.extent();
  // One invocation per output for short rows, and for small reductions with many outputs
  // (a squeeze-excite pool: 240 channels of 196), where a workgroup tree's barriers would
  // cost more than the loop; otherwise one workgroup per output.
  if (R <= 32 || (s.outputs() >= 64 && R <= 1024 && R * s.outputs() <= (1 << 18))) {
    kb.per_element(s.outputs(), [&](Block& b, const Ex& o) {
      const Ex acc = b.mut(t, identity(lk.attrs.reduce, t), "acc");
      b.loop("r", lit_i(0), lit_i(R), lit_i(1), [&](Block& in, const Ex& r) {
        const Ex v = in.let(cast_value(kb.eval(in, e, merge(in, s, o, r)), e.dtype, ot));
        in.assign(acc, comb(in, acc, v));
      });
      kb.store(b, &lk, lk.outputs[0], lk.out_layouts[0], merge(b, s, o, lit_i(0)), acc);
    });
    return;
  }
  // one workgroup per output: strided partials, then a tree
  kb.k.workgroup_size = static_cast<int>(pow2_at_least(R, 32, 256));
  kb.k.workgroups = s.outputs();
  Block b = kb.body();
  const Ex o = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  const Ex acc = b.mut(t, identity(lk.attrs.reduce, t), "acc");
  b.loop("r", lid, lit_i(R), lit_i(kb.k.workgroup_size), [&](Block& in, const Ex& r) {
    const Ex v = in.let(cast_value(kb.eval(in, e, merge(in, s, o, r)), e.dtype, ot));
    in.assign(acc, comb(in, acc, v));
  });
  // subgroup operations where they give the combiner's result: sums and products; max and
  // min of integers (a float max must propagate NaN, which subgroupMax need not)
  const char* sg = nullptr;
  switch (lk.attrs.reduce) {
    case ReduceKind::kSum: sg = t == Ty::kBool ? nullptr : "subgroupAdd"; break;
    case ReduceKind::kProd: sg = t == Ty::kBool ? nullptr : "subgroupMul"; break;
    case ReduceKind::kMax: sg = t == Ty::kI32 ? "subgroupMax" : nullptr; break;
    case ReduceKind::kMin: sg = t == Ty::kI32 ? "subgroupMin" : nullptr; break;
  }
  const Ex total = kb.tree(b, acc, "red", comb, sg, identity(lk.attrs.reduce, t));
  b.if_(bin("==", lid, lit_i(0)), [&](Block& in) {
    kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], merge(in, s, o, lit_i(0)), total);
  });
}

void t_softmax(KB& kb, const chroma::Kernel& lk) {
  std::vector<bool> mask(lk.shape.size(), false);
  mask[static_cast<size_t>(lk.attrs.axis)] = true;
  const Split s = split(lk.shape, mask);
  const Expr& e = lk.inputs[0];
  if (compute_type(e.dtype) != Ty::kF32) throw Unsupported("softmax of a non-float32 tensor");
  const int64_t R = s.extent();
  const auto mx = combiner(ReduceKind::kMax, DType::kF32), sum = combiner(ReduceKind::kSum, DType::kF32);
  if (R <= 32) {  // short rows (attention over a few tokens): one invocation per row, three loops
    kb.per_element(s.outputs(), [&](Block& b, const Ex& o) {
      const Ex m = b.mut(Ty::kF32, identity(ReduceKind::kMax, Ty::kF32), "m");
      b.loop("r", lit_i(0), lit_i(R), lit_i(1), [&](Block& in, const Ex& r) { in.assign(m, mx(in, m, kb.eval(in, e, merge(in, s, o, r)))); });
      const Ex total = b.mut(Ty::kF32, lit_f(0), "s");
      b.loop("r", lit_i(0), lit_i(R), lit_i(1), [&](Block& in, const Ex& r) {
        in.assign(total, add(total, call("exp", Ty::kF32, {bin("-", kb.eval(in, e, merge(in, s, o, r)), m)})));
      });
      const Ex logsum = lk.attrs.log ? b.let(call("log", Ty::kF32, {total})) : nullptr;
      b.loop("r", lit_i(0), lit_i(R), lit_i(1), [&](Block& in, const Ex& r) {
        const std::vector<Ex> c = merge(in, s, o, r);
        const Ex x = in.let(bin("-", kb.eval(in, e, c), m));
        kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], c,
                 lk.attrs.log ? bin("-", x, logsum) : bin("/", call("exp", Ty::kF32, {x}), total));
      });
    });
    return;
  }
  kb.k.workgroup_size = static_cast<int>(pow2_at_least(R, 32, 256));
  kb.k.workgroups = s.outputs();
  const int W = kb.k.workgroup_size;
  Block b = kb.body();
  const Ex o = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  const Ex m0 = b.mut(Ty::kF32, identity(ReduceKind::kMax, Ty::kF32), "m");
  b.loop("r", lid, lit_i(R), lit_i(W), [&](Block& in, const Ex& r) {
    in.assign(m0, mx(in, m0, kb.eval(in, e, merge(in, s, o, r))));
  });
  // subgroupMax need not propagate NaN, but a NaN in the row makes every output NaN anyway
  const Ex m = kb.tree(b, m0, "red", mx, "subgroupMax", identity(ReduceKind::kMax, Ty::kF32));
  const Ex s0 = b.mut(Ty::kF32, lit_f(0), "s");
  b.loop("r", lid, lit_i(R), lit_i(W), [&](Block& in, const Ex& r) {
    in.assign(s0, add(s0, call("exp", Ty::kF32, {bin("-", kb.eval(in, e, merge(in, s, o, r)), m)})));
  });
  const Ex total = kb.tree(b, s0, "red", sum, "subgroupAdd", lit_f(0));
  const Ex logsum = lk.attrs.log ? b.let(call("log", Ty::kF32, {total})) : nullptr;
  b.loop("r", lid, lit_i(R), lit_i(W), [&](Block& in, const Ex& r) {
    const std::vector<Ex> c = merge(in, s, o, r);
    const Ex x = in.let(bin("-", kb.eval(in, e, c), m));
    kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], c,
             lk.attrs.log ? bin("-", x, logsum) : bin("/", call("exp", Ty::kF32, {x}), total));
  });
}

// Index of the first maximum (minimum); NaN counts as the extreme (PyTorch's argmax).
void t_arg_reduce(KB& kb, const chroma::Kernel& lk) {
  const Split s = split(lk.shape, reduced_mask(lk));
  const Expr& e = lk.inputs[0];
  const Ty t = compute_type(e.dtype);
  const bool is_max = lk.attrs.reduce == ReduceKind::kMax;
  const int64_t R = s.extent();
  // (a, ai) then (b, bi): does b win? Entries with index R are empty.
  auto wins = [&](Block& b, const Ex& av, const Ex& ai, const Ex& bv, const Ex& bi) {
    Ex better = bin(is_max ? ">" : "<", convert(t == Ty::kBool ? Ty::kI32 : t, bv), convert(t == Ty::kBool ? Ty::kI32 : t, av));
    const Ex tie = bin("&&", bin("==", bv, av), bin("<", bi, ai));
    Ex w = bin("||", better, tie);
    if (t == Ty::kF32) {
      const auto nan = [](const Ex& x) {
        return bin(">", bin("&", bitcast(Ty::kU32, x), lit_u(0x7fffffffu)), lit_u(0x7f800000u));
      };
      const Ex an = b.let(nan(av)), bn = b.let(nan(bv));
      w = select(bin("&&", un("!", an), w), select(lit_b(false), bin("<", bi, ai), an), bn);
    }
    return b.let(bin("&&", bin("<", bi, lit_i(R)), bin("||", bin(">=", ai, lit_i(R)), w)));
  };
  kb.k.workgroup_size = static_cast<int>(pow2_at_least(R, 32, 256));
  kb.k.workgroups = s.outputs();
  const int W = kb.k.workgroup_size;
  Block b = kb.body();
  const Ex o = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  const Ex bv = b.mut(t, lit(t, 0), "bv");
  const Ex bi = b.mut(Ty::kI32, lit_i(R), "bi");
  b.loop("r", lid, lit_i(R), lit_i(W), [&](Block& in, const Ex& r) {
    const Ex v = in.let(kb.eval(in, e, merge(in, s, o, r)));
    in.if_(wins(in, bv, bi, v, r), [&](Block& tb) {
      tb.assign(bv, v);
      tb.assign(bi, r);
    });
  });
  kb.add_shared("sv", t, W);
  kb.add_shared("si", Ty::kI32, W);
  b.shared_store("sv", lid, bv);
  b.shared_store("si", lid, bi);
  b.barrier();
  for (int st = W / 2; st > 0; st /= 2) {
    b.if_(bin("<", lid, lit_i(st)), [&](Block& in) {
      const Ex j = add(lid, lit_i(st));
      const Ex av = in.let(load_array(Space::kShared, "sv", t, lid)), ai = in.let(load_array(Space::kShared, "si", Ty::kI32, lid));
      const Ex v2 = in.let(load_array(Space::kShared, "sv", t, j)), i2 = in.let(load_array(Space::kShared, "si", Ty::kI32, j));
      in.if_(wins(in, av, ai, v2, i2), [&](Block& tb) {
        tb.shared_store("sv", lid, v2);
        tb.shared_store("si", lid, i2);
      });
    });
    b.barrier();
  }
  b.if_(bin("==", lid, lit_i(0)), [&](Block& in) {
    kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], merge(in, s, o, lit_i(0)), load_array(Space::kShared, "si", Ty::kI32, lit_i(0)));
  });
}

// A product with few rows (M <= 8, `rows`) or few columns (N <= 8): the R = M (or N) sums of
// each column (row) of the large dimension stay in registers, so the large operand is read
// once (memory-bound: the unembedding of a decoder, a GEMV). Each invocation owns C columns W
// apart, so consecutive invocations read consecutive elements of a row-major operand; the
// small operand (R x K) is staged in workgroup memory once per workgroup when it fits, so the
// inner loop reads R values from it per C loads of the large operand.
void t_matmul_skinny(KB& kb, const chroma::Kernel& lk, bool rows, Ty t, const Shape& batch, int64_t M, int64_t N,
                     int64_t K) {
  const Expr& A = lk.inputs[0];
  const Expr& B = lk.inputs[1];
  const int64_t R = rows ? M : N, L = rows ? N : M, nb = numel(batch);
  const int W = static_cast<int>(pow2_at_least(L, 64, 256));
  const int64_t C = L >= 16 * W ? 4 : 1;
  const int64_t groups = (L + W * C - 1) / (W * C);
  if (nb * groups >= (1ll << 31) || nb * M * N >= (1ll << 31)) throw Unsupported("more than 2^31 elements in one kernel");
  kb.k.workgroup_size = W;
  kb.k.workgroups = std::max<int64_t>(1, nb * groups);
  const bool staged = R * K * 4 <= 8192;
  Block b = kb.body();
  const Ex wg = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  const Ex bt = b.let(bin("/", wg, lit_i(groups))), g = b.let(bin("%", wg, lit_i(groups)));
  const std::vector<Ex> bc = KB::coords_of(b, bt, batch);
  // (small index r, k) -> value of the small operand; (k, large index) -> the large one's
  auto at = [&](Block& in, const Expr& e, const Ex& i, const Ex& j) {
    std::vector<Ex> c = bc;
    c.push_back(i);
    c.push_back(j);
    return kb.eval(in, e, c);
  };
  auto small = [&](Block& in, const Ex& r, const Ex& k) { return rows ? at(in, A, r, k) : at(in, B, k, r); };
  auto large = [&](Block& in, const Ex& k, const Ex& l) { return rows ? at(in, B, k, l) : at(in, A, l, k); };
  if (staged) {
    kb.add_shared("sm", t, R * K);
    b.loop("s", lid, lit_i(R * K), lit_i(W), [&](Block& in, const Ex& si) {
      in.shared_store("sm", si, small(in, in.let(bin("/", si, lit_i(K))), in.let(bin("%", si, lit_i(K)))));
    });
    b.barrier();
  }
  std::vector<Ex> col, valid, clamped;
  for (int64_t j = 0; j < C; ++j) {
    col.push_back(b.let(add(add(mul(g, lit_i(W * C)), lit_i(j * W)), lid), "l"));
    valid.push_back(b.let(bin("<", col.back(), lit_i(L))));
    clamped.push_back(b.let(call("min", Ty::kI32, {col.back(), lit_i(L - 1)})));  // every read in bounds
  }
  std::vector<std::vector<Ex>> acc(static_cast<size_t>(R));
  for (auto& row : acc) {
    for (int64_t j = 0; j < C; ++j) row.push_back(b.mut(t, lit(t, 0), "acc"));
  }
  b.loop("k", lit_i(0), lit_i(K), lit_i(1), [&](Block& in, const Ex& k) {
    std::vector<Ex> lv;
    for (int64_t j = 0; j < C; ++j) lv.push_back(in.let(large(in, k, clamped[static_cast<size_t>(j)])));
    for (int64_t r = 0; r < R; ++r) {
      const Ex sv = in.let(staged ? load_array(Space::kShared, "sm", t, add(lit_i(r * K), k)) : small(in, lit_i(r), k));
      for (int64_t j = 0; j < C; ++j) {
        Ex& a = acc[static_cast<size_t>(r)][static_cast<size_t>(j)];
        in.assign(a, add(a, rows ? mul(sv, lv[static_cast<size_t>(j)]) : mul(lv[static_cast<size_t>(j)], sv)));
      }
    }
  });
  for (int64_t j = 0; j < C; ++j) {
    b.if_(valid[static_cast<size_t>(j)], [&](Block& in) {
      for (int64_t r = 0; r < R; ++r) {
        std::vector<Ex> c = bc;
        c.push_back(rows ? lit_i(r) : col[static_cast<size_t>(j)]);
        c.push_back(rows ? col[static_cast<size_t>(j)] : lit_i(r));
        kb.store_result(in, lk, c, acc[static_cast<size_t>(r)][static_cast<size_t>(j)]);
      }
    });
  }
}

// A (batched) product C[m, n] = sum_k A[m, k] B[k, n] tiled in workgroup memory, for the
// matrix products and the im2col-tiled convolutions: 16 x 16 invocations, each owning an
// RM x RN block of C (rows ty + 16 i, columns tx + 16 j), so a workgroup computes a
// 16 RM x 16 RN tile from 16-deep slices of A and B staged in workgroup memory. The operands
// are read through callbacks (called in bounds only), so A can be an implicit im2col matrix.
struct Gemm {
  int64_t batches = 1, M = 0, N = 0, K = 0;
  bool a_k_fastest = true;  // consecutive invocations stage consecutive k of A (else of m)
  bool b_n_fastest = true;  // ... consecutive n of B (else of k)
  std::function<void(Block&, const Ex& batch)> prologue;
  std::function<Ex(Block&, const Ex& m, const Ex& k)> a;
  std::function<Ex(Block&, const Ex& k, const Ex& n)> b;
  std::function<void(Block&, const Ex& m, const Ex& n, const Ex& acc)> store;
};

void tiled_gemm(KB& kb, Ty t, const Gemm& g) {
  // 8-deep slices: SwiftShader's pipeline compile time grows with the workgroup memory
  // declared (about 0.35 ms per element: 16-deep slices of 64 x 64 tiles took 0.7 s).
  constexpr int64_t T = 16, BK = 8;
  const int64_t RM = g.M >= 64 ? 4 : g.M >= 32 ? 2 : 1, RN = g.N >= 64 ? 4 : g.N >= 32 ? 2 : 1;
  const int64_t BM = T * RM, BN = T * RN;
  const int64_t tm = (g.M + BM - 1) / BM, tn = (g.N + BN - 1) / BN;
  if (g.batches * tm * tn >= (1ll << 31) || g.batches * g.M * g.N >= (1ll << 31)) {
    throw Unsupported("more than 2^31 elements in one kernel");
  }
  kb.k.workgroup_size = static_cast<int>(T * T);
  kb.k.workgroups = std::max<int64_t>(1, g.batches * tm * tn);
  kb.add_shared("ta", t, BM * BK);
  kb.add_shared("tb", t, BK * BN);
  Block b = kb.body();
  const Ex wg = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  const Ex bt = b.let(bin("/", wg, lit_i(tm * tn)), "bt");
  const Ex tile = b.let(bin("%", wg, lit_i(tm * tn)));
  const Ex m0 = b.let(mul(bin("/", tile, lit_i(tn)), lit_i(BM)), "m0");
  const Ex n0 = b.let(mul(bin("%", tile, lit_i(tn)), lit_i(BN)), "n0");
  const Ex ty = b.let(bin("/", lid, lit_i(T))), tx = b.let(bin("%", lid, lit_i(T)));
  if (g.prologue) g.prologue(b, bt);
  // The RM x RN accumulators: a private array indexed by literals in the inner loop and by
  // the loop of the final stores (so the epilogue appears once in the code).
  b.array("acc", t, RM * RN);
  for (int64_t i = 0; i < RM * RN; ++i) b.assign_elem("acc", lit_i(i), lit(t, 0));
  // Stages a rows x cols slice (row-major in workgroup memory `name`), `count` elements at
  // most 256 per step; `inner_fastest`: consecutive invocations take consecutive columns.
  auto stage = [&](Block& in, const char* name, int64_t rows, int64_t cols, bool inner_fastest,
                   const std::function<Ex(Block&, const Ex& r, const Ex& c)>& at) {
    const int64_t count = rows * cols, steps = (count + T * T - 1) / (T * T);
    in.loop("s", lit_i(0), lit_i(steps), lit_i(1), [&](Block& l, const Ex& step) {
      const Ex idx = l.let(add(lid, mul(step, lit_i(T * T))));
      auto body = [&](Block& bb) {
        const Ex r = bb.let(inner_fastest ? bin("/", idx, lit_i(cols)) : bin("%", idx, lit_i(rows)));
        const Ex c = bb.let(inner_fastest ? bin("%", idx, lit_i(cols)) : bin("/", idx, lit_i(rows)));
        bb.shared_store(name, add(mul(r, lit_i(cols)), c), at(bb, r, c));
      };
      if (count % (T * T) == 0) body(l);
      else l.if_(bin("<", idx, lit_i(count)), body);
    });
  };
  b.loop("k0", lit_i(0), lit_i(g.K), lit_i(BK), [&](Block& in, const Ex& k0) {
    stage(in, "ta", BM, BK, g.a_k_fastest, [&](Block& l, const Ex& mm, const Ex& kk) {
      const Ex gm = l.let(add(m0, mm)), gk = l.let(add(k0, kk));
      const Ex v = l.mut(t, lit(t, 0), "av");
      l.if_(bin("&&", bin("<", gm, lit_i(g.M)), bin("<", gk, lit_i(g.K))), [&](Block& tb) { tb.assign(v, g.a(tb, gm, gk)); });
      return v;
    });
    stage(in, "tb", BK, BN, g.b_n_fastest, [&](Block& l, const Ex& kk, const Ex& nn) {
      const Ex gk = l.let(add(k0, kk)), gn = l.let(add(n0, nn));
      const Ex v = l.mut(t, lit(t, 0), "bv");
      l.if_(bin("&&", bin("<", gk, lit_i(g.K)), bin("<", gn, lit_i(g.N))), [&](Block& tb) { tb.assign(v, g.b(tb, gk, gn)); });
      return v;
    });
    in.barrier();
    in.loop("kk", lit_i(0), lit_i(BK), lit_i(1), [&](Block& l, const Ex& kk) {
      std::vector<Ex> av, bv;
      for (int64_t i = 0; i < RM; ++i) {
        av.push_back(l.let(load_array(Space::kShared, "ta", t, add(mul(add(ty, lit_i(i * T)), lit_i(BK)), kk)), "a"));
      }
      for (int64_t j = 0; j < RN; ++j) {
        bv.push_back(l.let(load_array(Space::kShared, "tb", t, add(add(mul(kk, lit_i(BN)), tx), lit_i(j * T))), "b"));
      }
      for (int64_t i = 0; i < RM; ++i) {
        for (int64_t j = 0; j < RN; ++j) {
          const Ex ai = lit_i(i * RN + j);
          l.assign_elem("acc", ai, add(load_array(Space::kPrivate, "acc", t, ai), mul(av[static_cast<size_t>(i)], bv[static_cast<size_t>(j)])));
        }
      }
    });
    in.barrier();
  });
  b.loop("o", lit_i(0), lit_i(RM * RN), lit_i(1), [&](Block& l, const Ex& i) {
    const Ex gm = l.let(add(add(m0, ty), mul(bin("/", i, lit_i(RN)), lit_i(T))), "gm");
    const Ex gn = l.let(add(add(n0, tx), mul(bin("%", i, lit_i(RN)), lit_i(T))), "gn");
    l.if_(bin("&&", bin("<", gm, lit_i(g.M)), bin("<", gn, lit_i(g.N))),
          [&](Block& in) { g.store(in, gm, gn, in.let(load_array(Space::kPrivate, "acc", t, i))); });
  });
}

// Whether consecutive elements of the last (else the second-to-last) dimension of a loaded
// operand are adjacent in memory; fused expressions count as row-major.
bool inner_contiguous(const Expr& e) {
  if (e.kind != Expr::kLoad) return true;
  const size_t r = e.layout.strides.size();
  return !(e.layout.strides[r - 1] != 1 && e.layout.strides[r - 2] == 1);
}

// C = A B over batch dimensions: few rows or columns go to t_matmul_skinny; otherwise
// tiled_gemm.
void t_matmul(KB& kb, const chroma::Kernel& lk) {
  const Expr& A = lk.inputs[0];
  const Expr& B = lk.inputs[1];
  const Ty t = compute_type(A.dtype);  // float32, or integers in i32 (wrapping as int32 does)
  if (t == Ty::kBool) throw Unsupported("matrix products of bool");
  const size_t r = lk.shape.size();
  const int64_t M = lk.shape[r - 2], N = lk.shape[r - 1], K = A.shape()[r - 1];
  const Shape batch(lk.shape.begin(), lk.shape.end() - 2);
  if (M <= 8 || N <= 8) return t_matmul_skinny(kb, lk, M <= 8, t, batch, M, N, K);
  std::vector<Ex> bc;
  auto coords = [&](const Ex& i, const Ex& j) {
    std::vector<Ex> c = bc;
    c.push_back(i);
    c.push_back(j);
    return c;
  };
  Gemm g;
  g.batches = numel(batch);
  g.M = M;
  g.N = N;
  g.K = K;
  g.a_k_fastest = inner_contiguous(A);
  g.b_n_fastest = inner_contiguous(B);
  g.prologue = [&](Block& b, const Ex& bt) { bc = KB::coords_of(b, bt, batch); };
  g.a = [&](Block& b, const Ex& m, const Ex& k) { return kb.eval(b, A, coords(m, k)); };
  g.b = [&](Block& b, const Ex& k, const Ex& n) { return kb.eval(b, B, coords(k, n)); };
  g.store = [&](Block& b, const Ex& m, const Ex& n, const Ex& acc) { kb.store_result(b, lk, coords(m, n), acc); };
  tiled_gemm(kb, t, g);
}

// torch.index_select / embedding (kGather) and torch.gather (kGatherElements); an index
// outside its dimension sets the status block and reads element 0 instead.
void t_gather(KB& kb, const chroma::Kernel& lk) {
  const Expr& src = lk.inputs[0];
  const Expr& idx = lk.inputs[1];
  const Shape ss = src.shape();
  const size_t axis = static_cast<size_t>(lk.attrs.axis);
  const int64_t dim = ss[axis];
  const size_t ir = idx.shape().size();
  kb.per_element(numel(lk.shape), [&](Block& b, const Ex& i) {
    const std::vector<Ex> o = KB::coords_of(b, i, lk.shape);
    std::vector<Ex> ic, sc;
    if (lk.kind == chroma::Kernel::kGather) {
      ic.assign(o.begin() + static_cast<long>(axis), o.begin() + static_cast<long>(axis + ir));
    } else {
      ic = o;
    }
    const Ex v = b.let(kb.eval(b, idx, ic), "ix");
    const Ex bad = b.let(bin("||", bin("<", v, lit_i(0)), bin(">=", v, lit_i(dim))));
    kb.flag_bad_index(b, bad, v, dim, lk.attrs.axis);
    const Ex safe = b.let(select(v, lit_i(0), bad));
    if (lk.kind == chroma::Kernel::kGather) {
      // src coordinates: the output's before the axis, the index, the output's after the
      // index dimensions (a scalar index has none)
      sc.assign(o.begin(), o.begin() + static_cast<long>(axis));
      sc.push_back(safe);
      sc.insert(sc.end(), o.begin() + static_cast<long>(axis + ir), o.end());
    } else {
      sc = o;
      sc[axis] = safe;
    }
    kb.store(b, &lk, lk.outputs[0], lk.out_layouts[0], o, kb.eval(b, src, sc));
  });
}

// An order key: larger keys come first. Floats map to a monotone u32 (NaN first when
// largest, last when smallest, as the CPU's top-k); integers flip the sign bit.
Ex order_key(Block& b, const Ex& v, bool largest) {
  Ex key;
  if (v->ty == Ty::kF32) {
    const Ex u = b.let(bitcast(Ty::kU32, v));
    const Ex nan = bin(">", bin("&", u, lit_u(0x7fffffffu)), lit_u(0x7f800000u));
    // -0 and +0 are equal (a tie, decided by index)
    const Ex z = b.let(select(u, lit_u(0), bin("==", bin("&", u, lit_u(0x7fffffffu)), lit_u(0))));
    const Ex mono = select(bin("|", z, lit_u(0x80000000u)), un("~", z), bin("!=", bin(">>", z, lit_u(31)), lit_u(0)));
    key = largest ? select(mono, lit_u(0xffffffffu), nan) : select(un("~", mono), lit_u(0), nan);
    return b.let(key);
  }
  const Ex u = bin("^", bitcast(Ty::kU32, convert(Ty::kI32, v)), lit_u(0x80000000u));
  return b.let(largest ? u : un("~", u));
}

// Top-k (and sort, k = n) along an axis: one invocation per row picks the k best in order,
// each pass the best entry strictly after the previous pick (ties go to the lower index).
void t_topk(KB& kb, const chroma::Kernel& lk) {
  std::vector<bool> mask(lk.shape.size(), false);
  mask[static_cast<size_t>(lk.attrs.axis)] = true;
  const Split s = split(lk.shape, mask);
  const Expr& e = lk.inputs[0];
  const int64_t R = s.extent(), K = lk.attrs.k;
  const Ty t = compute_type(e.dtype);
  kb.per_element(s.outputs(), [&](Block& b, const Ex& o) {
    const Ex pk = b.mut(Ty::kU32, lit_u(0xffffffffu), "pk");
    const Ex pi = b.mut(Ty::kI32, lit_i(-1), "pi");
    b.loop("j", lit_i(0), lit_i(K), lit_i(1), [&](Block& in, const Ex& j) {
      const Ex bk = in.mut(Ty::kU32, lit_u(0), "bk");
      const Ex bi = in.mut(Ty::kI32, lit_i(-1), "bi");
      const Ex bv = in.mut(t, lit(t, 0), "bv");
      in.loop("r", lit_i(0), lit_i(R), lit_i(1), [&](Block& l, const Ex& r) {
        const Ex v = l.let(kb.eval(l, e, merge(l, s, o, r)));
        const Ex key = order_key(l, v, lk.attrs.largest);
        const Ex after = bin("||", bin("<", key, pk), bin("&&", bin("==", key, pk), bin(">", r, pi)));
        const Ex better = bin("||", bin("<", bi, lit_i(0)), bin("||", bin(">", key, bk), bin("&&", bin("==", key, bk), bin("<", r, bi))));
        l.if_(bin("&&", after, better), [&](Block& tb) {
          tb.assign(bk, key);
          tb.assign(bi, r);
          tb.assign(bv, v);
        });
      });
      const std::vector<Ex> c = merge(in, s, o, j);
      kb.store(in, &lk.out_layouts[0], lk.outputs[0], lk.out_layouts[0], c, bv);
      kb.store(in, &lk.out_layouts[1], lk.outputs[1], lk.out_layouts[1], c, bi);
      in.assign(pk, bk);
      in.assign(pi, bi);
    });
  });
}

// Inclusive scan along an axis: one invocation per row, in order (cumsum, cumprod, cummax,
// cummin, logcumsumexp).
void t_scan(KB& kb, const chroma::Kernel& lk, const Program& p) {
  std::vector<bool> mask(lk.shape.size(), false);
  mask[static_cast<size_t>(lk.attrs.axis)] = true;
  const Split s = split(lk.shape, mask);
  const Expr& e = lk.inputs[0];
  const DType ot = p.buffers[static_cast<size_t>(lk.outputs[0])].type.dtype;
  const Ty t = compute_type(ot);
  kb.per_element(s.outputs(), [&](Block& b, const Ex& o) {
    const Ex acc = b.mut(t, identity(lk.attrs.reduce, t), "acc");
    b.loop("r", lit_i(0), lit_i(s.extent()), lit_i(1), [&](Block& in, const Ex& r) {
      const std::vector<Ex> c = merge(in, s, o, r);
      const Ex v = in.let(cast_value(kb.eval(in, e, c), e.dtype, ot));
      if (lk.attrs.log) {  // log(exp(acc) + exp(v)), exact at infinities
        if (t != Ty::kF32) throw Unsupported("logcumsumexp of a non-float tensor");
        const Ex m = in.let(map_op(in, EwOp::k_maximum, ot, {ot, ot}, {acc, v}, {nullptr, nullptr}));
        const Ex lo = in.let(map_op(in, EwOp::k_minimum, ot, {ot, ot}, {acc, v}, {nullptr, nullptr}));
        const Ex l1 = map_op(in, EwOp::k_log1p, ot, {ot}, {in.let(call("exp", Ty::kF32, {bin("-", lo, m)}))}, {nullptr});
        const Ex first = bin("==", r, lit_i(0));
        in.assign(acc, select(select(add(m, l1), m, bin("==", lo, m)), v, first));
      } else {
        in.assign(acc, select(combiner(lk.attrs.reduce, ot)(in, acc, v), v, bin("==", r, lit_i(0))));
      }
      kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], c, acc);
    });
  });
}

// Convolution. Grouped ones with at least 16 output channels per group and 64 products per
// output run im2col-tiled: per group, the product of the implicit im2col matrix
// [batch x output positions, Cin/g x kernel positions] (never written; zero padding by
// bounds tests) and the weights [Cin/g x kernel positions, Cout/g], through tiled_gemm. The
// rest (depthwise and other thin ones) run direct: one invocation per output element.
void t_conv(KB& kb, const chroma::Kernel& lk) {
  const Expr& x = lk.inputs[0];
  const Expr& w = lk.inputs[1];
  if (compute_type(x.dtype) != Ty::kF32) throw Unsupported("convolution of a non-float32 tensor");
  if (!lk.post_ops.empty()) throw Unsupported("convolution post-ops (a CPU lowering choice)");
  const Shape xs = x.shape(), ws = w.shape();
  const size_t d = xs.size() - 2;
  const int64_t groups = lk.attrs.k, cout = ws[0], cin_g = ws[1], cout_g = cout / groups;
  const Shape window(ws.begin() + 2, ws.end());
  const Shape out_space(lk.shape.begin() + 2, lk.shape.end());
  const int64_t kdim = cin_g * numel(window);
  // The input element at output position `o` (spatial coordinates) and window position
  // `kw`: zero where that is padding, read branch-free (the address clamped inside, the
  // value selected): SwiftShader compiles a conditional read per tap very slowly.
  auto input_at = [&](Block& b, const Ex& n, const Ex& cx, const std::vector<Ex>& o, const std::vector<Ex>& kw) {
    Ex ok;
    std::vector<Ex> xc{n, cx};
    for (size_t dim = 0; dim < d; ++dim) {
      const int64_t st = lk.attrs.ints[dim], pd = lk.attrs.ints[d + dim], dl = lk.attrs.ints[2 * d + dim];
      const Ex pos = b.let(add(bin("-", mul(o[dim], lit_i(st)), lit_i(pd)), mul(kw[dim], lit_i(dl))));
      if (pd == 0 && (out_space[dim] - 1) * st + (window[dim] - 1) * dl < xs[2 + dim]) {  // never outside
        xc.push_back(pos);
        continue;
      }
      xc.push_back(b.let(call("min", Ty::kI32, {call("max", Ty::kI32, {pos, lit_i(0)}), lit_i(xs[2 + dim] - 1)})));
      const Ex inside = bin("&&", bin(">=", pos, lit_i(0)), bin("<", pos, lit_i(xs[2 + dim])));
      ok = ok ? bin("&&", ok, inside) : inside;
    }
    const Ex v = b.let(kb.eval(b, x, xc));
    return ok ? b.let(select(lit_f(0), v, ok)) : v;
  };
  if (cout_g >= 16 && kdim >= 64) {
    Shape mshape{lk.shape[0]};
    mshape.insert(mshape.end(), out_space.begin(), out_space.end());
    Shape kshape{cin_g};
    kshape.insert(kshape.end(), window.begin(), window.end());
    Ex grp;
    Gemm g;
    g.batches = groups;
    g.M = numel(mshape);
    g.N = cout_g;
    g.K = kdim;
    g.a_k_fastest = false;  // consecutive output positions: consecutive input columns
    g.b_n_fastest = false;  // the weights are [Cout, Cin/g x window] row-major
    g.prologue = [&](Block&, const Ex& bt) { grp = bt; };
    g.a = [&](Block& b, const Ex& m, const Ex& k) {
      const std::vector<Ex> mc = KB::coords_of(b, m, mshape), kc = KB::coords_of(b, k, kshape);
      const Ex cx = groups == 1 ? kc[0] : b.let(add(mul(grp, lit_i(cin_g)), kc[0]));
      return input_at(b, mc[0], cx, std::vector<Ex>(mc.begin() + 1, mc.end()), std::vector<Ex>(kc.begin() + 1, kc.end()));
    };
    g.b = [&](Block& b, const Ex& k, const Ex& n) {
      std::vector<Ex> wc = KB::coords_of(b, k, kshape);
      wc.insert(wc.begin(), groups == 1 ? n : b.let(add(mul(grp, lit_i(cout_g)), n)));
      return kb.eval(b, w, wc);
    };
    g.store = [&](Block& b, const Ex& m, const Ex& n, const Ex& acc) {
      std::vector<Ex> oc = KB::coords_of(b, m, mshape);
      oc.insert(oc.begin() + 1, groups == 1 ? n : b.let(add(mul(grp, lit_i(cout_g)), n)));
      kb.store_result(b, lk, oc, acc);
    };
    return tiled_gemm(kb, Ty::kF32, g);
  }
  // Direct: one invocation per output position and block of CB output channels of a group
  // (each input tap read once for CB products); CB divides Cout/g.
  int64_t cb = cout_g <= 8 ? cout_g : 1;
  for (int64_t c : {8, 4, 2}) {
    if (cout_g > 8 && cout_g % c == 0) {
      cb = c;
      break;
    }
  }
  Shape grid = lk.shape;
  grid[1] = cout / cb;
  kb.per_element(numel(grid), [&](Block& b, const Ex& i) {
    const std::vector<Ex> o = KB::coords_of(b, i, grid);
    const std::vector<Ex> os(o.begin() + 2, o.end());
    const Ex co0 = b.let(mul(o[1], lit_i(cb)), "co");
    const Ex g = b.let(bin("/", co0, lit_i(cout_g)));
    b.array("acc", Ty::kF32, cb);
    for (int64_t c = 0; c < cb; ++c) b.assign_elem("acc", lit_i(c), lit_f(0));
    b.loop("ci", lit_i(0), lit_i(cin_g), lit_i(1), [&](Block& in, const Ex& ci) {
      const Ex cx = in.let(add(mul(g, lit_i(cin_g)), ci));
      std::function<void(Block&, size_t, std::vector<Ex>)> win = [&](Block& bb, size_t dim, std::vector<Ex> kw) {
        if (dim == d) {
          const Ex xv = input_at(bb, o[0], cx, os, kw);
          for (int64_t c = 0; c < cb; ++c) {
            std::vector<Ex> wc{add(co0, lit_i(c)), ci};
            wc.insert(wc.end(), kw.begin(), kw.end());
            const Ex ai = lit_i(c);
            bb.assign_elem("acc", ai, add(load_array(Space::kPrivate, "acc", Ty::kF32, ai), mul(xv, kb.eval(bb, w, wc))));
          }
          return;
        }
        bb.loop("kw", lit_i(0), lit_i(window[dim]), lit_i(1), [&](Block& l, const Ex& k) {
          std::vector<Ex> kw2 = kw;
          kw2.push_back(k);
          win(l, dim + 1, kw2);
        });
      };
      win(in, 0, {});
    });
    auto store = [&](Block& l, const Ex& c) {
      std::vector<Ex> oc = o;
      oc[1] = l.let(add(co0, c));
      kb.store_result(l, lk, oc, l.let(load_array(Space::kPrivate, "acc", Ty::kF32, c)));
    };
    if (cb == 1) store(b, lit_i(0));
    else b.loop("c", lit_i(0), lit_i(cb), lit_i(1), store);
  });
}

// index_put / index_copy / scatter along an axis: dst[o with o[axis] = idx[o[axis]]] = vals[o].
// Plain writes: one invocation per value. Accumulating writes are deterministic without
// atomics: one invocation per destination element folds the values whose index names it,
// in index order (the CPU's order).
void t_index_put(KB& kb, const chroma::Kernel& lk, const Program& p) {
  const Expr& idx = lk.inputs[1];
  const Expr& vals = lk.inputs[2];
  const Buffer& ob = p.buffers[static_cast<size_t>(lk.outputs[0])];
  const size_t axis = static_cast<size_t>(lk.attrs.axis);
  const int64_t dim = ob.type.shape[axis];
  const DType ot = ob.type.dtype;
  if (!lk.attrs.accumulate) {
    kb.per_element(numel(lk.shape), [&](Block& b, const Ex& i) {
      std::vector<Ex> o = KB::coords_of(b, i, lk.shape);
      const Ex v = b.let(kb.eval(b, idx, {o[axis]}), "ix");
      const Ex bad = b.let(bin("||", bin("<", v, lit_i(0)), bin(">=", v, lit_i(dim))));
      kb.flag_bad_index(b, bad, v, dim, lk.attrs.axis);
      const Ex val = b.let(cast_value(kb.eval(b, vals, o), vals.dtype, ot));
      b.if_(un("!", bad), [&](Block& t) {
        std::vector<Ex> dc = o;
        dc[axis] = v;
        kb.store(t, &lk, lk.outputs[0], lk.out_layouts[0], dc, val);
      });
    });
    return;
  }
  Shape ds = lk.shape;
  ds[axis] = dim;
  const int64_t n = lk.shape[axis];
  const auto comb = combiner(lk.attrs.reduce, ot);
  Expr current;  // the destination's value before this kernel
  current.kind = Expr::kLoad;
  current.dtype = ot;
  current.buffer = lk.outputs[0];
  current.layout = lk.out_layouts[0];
  kb.per_element(numel(ds), [&](Block& b, const Ex& i) {
    const std::vector<Ex> dc = KB::coords_of(b, i, ds);
    const Ex acc = b.mut(compute_type(ot), kb.eval(b, current, dc), "acc");
    b.loop("j", lit_i(0), lit_i(n), lit_i(1), [&](Block& in, const Ex& j) {
      const Ex v = in.let(kb.eval(in, idx, {j}), "ix");
      const Ex bad = in.let(bin("||", bin("<", v, lit_i(0)), bin(">=", v, lit_i(dim))));
      kb.flag_bad_index(in, bad, v, dim, lk.attrs.axis);
      in.if_(bin("==", v, dc[axis]), [&](Block& t) {
        std::vector<Ex> vc = dc;
        vc[axis] = j;
        t.assign(acc, comb(t, acc, t.let(cast_value(kb.eval(t, vals, vc), vals.dtype, ot))));
      });
    });
    kb.store(b, &lk, lk.outputs[0], lk.out_layouts[0], dc, acc);
  });
}

}  // namespace

Generated generate(const Program& p, const std::function<Placement(int32_t)>& place, const Capabilities& caps,
                   const Dialect& d) {
  Generated out;
  std::map<std::string, int> module_of;  // text -> module
  std::vector<std::string> errors;
  for (size_t ki = 0; ki < p.kernels.size(); ++ki) {
    const chroma::Kernel& lk = p.kernels[ki];
    try {
      // The kernel's dispatches, built with or without subgroup operations.
      auto build = [&](bool subgroups) {
      std::vector<KB> parts;
      auto make = [&](const char* what) -> KB& {
        parts.emplace_back(p, place, std::string(chroma::kernel_kind(lk.kind)) + what, 256,
                           static_cast<int>(out.dispatches.size() + parts.size()), subgroups);
        return parts.back();
      };
      switch (lk.kind) {
        case chroma::Kernel::kAssign: t_assign(make(""), lk); break;
        case chroma::Kernel::kConcat: t_concat(make(""), lk); break;
        case chroma::Kernel::kReduce: t_reduce(make(""), lk, p); break;
        case chroma::Kernel::kSoftmax: t_softmax(make(""), lk); break;
        case chroma::Kernel::kArgReduce: t_arg_reduce(make(""), lk); break;
        case chroma::Kernel::kMatMul: t_matmul(make(""), lk); break;
        case chroma::Kernel::kGather:
        case chroma::Kernel::kGatherElements: t_gather(make(""), lk); break;
        case chroma::Kernel::kTopK: t_topk(make(""), lk); break;
        case chroma::Kernel::kScan: t_scan(make(""), lk, p); break;
        case chroma::Kernel::kConv: t_conv(make(""), lk); break;
        case chroma::Kernel::kIndexPut: {
          const Buffer& ob = p.buffers[static_cast<size_t>(lk.outputs[0])];
          if (!lk.in_place && numel(ob.type.shape) > 0) {  // the base first, as an assign
            chroma::Kernel copy;
            copy.kind = chroma::Kernel::kAssign;
            copy.shape = ob.type.shape;
            copy.inputs = {lk.inputs[0]};
            copy.outputs = lk.outputs;
            copy.out_layouts = lk.out_layouts;
            t_assign(make("_base"), copy);
          }
          if (numel(lk.shape) > 0) t_index_put(make(""), lk, p);
          break;
        }
        case chroma::Kernel::kLinalg:
          throw Unsupported("linear-algebra factorizations (LAPACK) are not available on GPU targets");
        case chroma::Kernel::kMatMulPacked:
        case chroma::Kernel::kMatMulGathered:
          throw Unsupported("internal: a CPU-only product kind reached the GPU generator");
      }
      return parts;
      };
      std::vector<KB> parts = build(caps.subgroup_size > 0);
      // A second text with subgroup operations for the runtimes to pick (Module::code_subgroups)
      // when the kernel has a use for them; the same params and bindings, or none.
      std::vector<KB> sg_parts;
      if (caps.subgroup_variants && caps.subgroup_size == 0 &&
          (lk.kind == chroma::Kernel::kReduce || lk.kind == chroma::Kernel::kSoftmax)) {
        sg_parts = build(true);
      }
      for (size_t pi = 0; pi < parts.size(); ++pi) {
        KB& kb = parts[pi];
        if (kb.k.body.empty()) continue;
        legalize(kb.k, caps);
        std::string code_sg;
        if (sg_parts.size() == parts.size() && sg_parts[pi].k.subgroups && sg_parts[pi].params == kb.params &&
            sg_parts[pi].slots == kb.slots) {
          legalize(sg_parts[pi].k, caps);
          code_sg = print_kernel(sg_parts[pi].k, d);
        }
        Dispatch dp;
        dp.grid_x = kb.k.grid_x;
        dp.grid_y = kb.k.grid_y;
        dp.params = kb.params;
        dp.slots = kb.slots;
        dp.lowered_kernel = static_cast<int>(ki);
        dp.label = lk.label;
        dp.node = lk.name;
        dp.source = lk.source;
        const std::string code = print_kernel(kb.k, d);
        auto it = module_of.find(code + '\0' + code_sg);
        if (it == module_of.end()) {
          Module m;
          m.name = "k" + std::to_string(out.modules.size()) + "_" + kb.k.name;
          m.code = code;
          m.code_subgroups = code_sg;
          m.workgroup_size = kb.k.workgroup_size;
          m.params = kb.k.params;
          for (const Slot& s : kb.k.slots) m.slot_writable.push_back(s.writable);
          for (const SharedArray& a : kb.k.shared) m.shared_bytes += 4 * a.count;
          it = module_of.emplace(code + '\0' + code_sg, static_cast<int>(out.modules.size())).first;
          out.modules.push_back(std::move(m));
        }
        dp.module = it->second;
        const Module& m = out.modules[static_cast<size_t>(dp.module)];
        out.max_slots = std::max(out.max_slots, static_cast<int>(m.slot_writable.size()));
        out.max_workgroup_size = std::max(out.max_workgroup_size, m.workgroup_size);
        out.max_shared_bytes = std::max(out.max_shared_bytes, m.shared_bytes);
        out.max_grid = std::max({out.max_grid, dp.grid_x, dp.grid_y});
        out.dispatches.push_back(std::move(dp));
      }
    } catch (const Unsupported& e) {
      std::ostringstream msg;
      msg << "  " << chroma::kernel_kind(lk.kind) << " '" << lk.label << "' (node " << (lk.name.empty() ? "?" : lk.name)
          << (lk.source.empty() ? "" : ", " + lk.source) << "): " << e.what();
      errors.push_back(msg.str());
    } catch (const CompileError& e) {
      errors.push_back("  " + std::string(chroma::kernel_kind(lk.kind)) + " '" + lk.label + "' (node " + lk.name + "): " + e.what());
    }
  }
  if (!errors.empty()) {
    std::string all = "target '" + d.name + "': " + std::to_string(errors.size()) + " kernel(s) cannot be compiled:\n";
    for (const std::string& e : errors) all += e + "\n";
    throw CompileError(all);
  }
  return out;
}

}  // namespace chroma::gpu

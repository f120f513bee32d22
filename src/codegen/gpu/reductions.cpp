// Reductions along rows (docs/gpu_generator.md, "Layers", B; declared in templates.h):
// reductions (an invocation per short row, else a workgroup tree per row), row groups (a
// reduction and the kernels that finish its rows in one dispatch), softmax, arg-max/min and
// inclusive scans; and the row split (Split) every row template shares.
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>

#include "codegen/gpu/templates.h"

namespace chroma::gpu::internal {

namespace {

EwOp combine_op(ReduceKind r) {
  switch (r) {
    case ReduceKind::kSum: return EwOp::k_add;
    case ReduceKind::kProd: return EwOp::k_mul;
    case ReduceKind::kMax: return EwOp::k_maximum;
    case ReduceKind::kMin: return EwOp::k_minimum;
  }
  return EwOp::k_add;
}

}  // namespace

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

std::vector<bool> reduced_mask(const chroma::Kernel& lk) {
  std::vector<bool> mask(lk.shape.size(), false);
  if (lk.kind == chroma::Kernel::kReduce) {
    for (int64_t a : lk.attrs.ints) mask[static_cast<size_t>(a)] = true;
  } else {
    mask[static_cast<size_t>(lk.attrs.axis)] = true;
  }
  return mask;
}

namespace {

// The workgroup form of a reduction, for row `wg` of `s`: each invocation folds a strided
// share of the row, then a tree over the workgroup; invocation 0 stores the result (unless
// `store` is false), which every invocation gets back.
Ex reduce_row(KB& kb, Block& b, const chroma::Kernel& lk, const Program& p, const Split& s, const std::string& shared,
              bool store = true) {
  const DType ot = p.buffers[static_cast<size_t>(lk.outputs[0])].type.dtype;
  const Ty t = compute_type(ot);
  const Expr& e = lk.inputs[0];
  const auto comb = combiner(lk.attrs.reduce, ot);
  const Ex o = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  const Ex acc = b.mut(t, identity(lk.attrs.reduce, t), "acc");
  b.loop("r", lid, lit_i(s.extent()), lit_i(kb.k.workgroup_size), [&](Block& in, const Ex& r) {
    const Ex v = in.let(cast_value(in, kb.eval(in, e, merge(in, s, o, r)), e.dtype, ot));
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
  const Ex total = kb.tree(b, acc, shared, comb, sg, identity(lk.attrs.reduce, t));
  if (store) {
    b.if_(eq(lid, lit_i(0)), [&](Block& in) {
      kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], merge(in, s, o, lit_i(0)), total);
    });
  }
  return total;
}

}  // namespace

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
        const Ex v = in.let(cast_value(in, kb.eval(in, e, merge(in, s, o, r)), e.dtype, ot));
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
  reduce_row(kb, b, lk, p, s, "red");
}

namespace {

// Whether a later member of a row group (t_row_group) can read what a member stored without
// reading memory other invocations write: 32-bit types, and the half types (rounded as stored);
// not the 8- and 16-bit integers and bool, whose words neighbouring invocations share.
bool resident_type(DType t) { return device_element_bytes(t) == 4 || is_half(t); }

Ex as_stored(Block& b, DType t, const Ex& v) {
  return is_half(t) ? b.let(half_value(b, t, half_bits(b, t, v))) : v;
}

// The widest row a row group (row_group) takes. Its dispatch has one workgroup per row, so a
// group of few wide rows would run its elementwise members on a few workgroups where they
// alone would fill the device; up to this width a row is a few iterations of each invocation
// (the hidden size of the language models people run), and wider rows keep their dispatches.
constexpr int64_t kMaxGroupRow = 16384;

// Whether a row group whose last member is kernel `end` stores a member's output `id`: unless
// it is an arena temporary no kernel after the group reads, whose readers in the group get its
// value from registers or by computing it again (resident_type).
bool group_stores(const Program& p, int32_t id, size_t end) {
  const Buffer& bf = p.buffers[static_cast<size_t>(id)];
  return bf.region != Region::kArena || bf.last > static_cast<int32_t>(end) || !resident_type(bf.type.dtype);
}

}  // namespace

// Kernels that share one row structure and run as one dispatch (t_row_group): adjacent kernels
// that iterate the same shape, each a reduction of the same dimensions or an assignment of
// every element, at least one a reduction with rows longer than a subgroup, where every
// member reads an earlier member's result only at its own row (a reduction's result) or
// element (an assignment's): RMSNorm and LayerNorm (the residual sum before them, one or two
// sums, the centred row, the normalized row), a softmax written out by hand (a maximum, the
// exponentials, their sum, the quotient). A result no kernel after the group reads is not
// stored (group_stores); every other buffer holds what it held before. A kernel whose writes
// could overlap any member's reads or writes ends the group, as does one that reads an
// earlier result at another row or element. Returns the members' kernel indices (one: no
// group).
std::vector<size_t> row_group(const Program& p, const std::function<Placement(int32_t)>& place, size_t first) {
  const auto single = [](const chroma::Kernel& k) {
    return (k.kind == chroma::Kernel::kReduce || k.kind == chroma::Kernel::kAssign) && k.inputs.size() == 1 &&
           k.outputs.size() == 1 && k.out_layouts.size() == 1 && k.epilogue() < 0;
  };
  // the row structure: the first reduction's, after any leading assignments
  size_t ri = first;
  while (ri < p.kernels.size() && single(p.kernels[ri]) && p.kernels[ri].kind == chroma::Kernel::kAssign) ++ri;
  if (ri == p.kernels.size() || !single(p.kernels[ri])) return {first};
  const chroma::Kernel& f = p.kernels[ri];
  const std::vector<bool> mask = reduced_mask(f);
  const Split s = split(f.shape, mask);
  if (s.extent() <= 32 || s.extent() > kMaxGroupRow || s.outputs() == 0) return {first};
  const auto words = [&](int32_t id) {
    const Buffer& bf = p.buffers[static_cast<size_t>(id)];
    return device_storage_bytes(bf.type.dtype, numel(bf.type.shape)) / 4;
  };
  const auto overlap = [&](int32_t a, int32_t b) {
    if (a == b) return true;
    const Placement pa = place(a), pb = place(b);
    return pa == pb && pa.word < pb.word + words(b) && pb.word < pa.word + words(a);
  };
  // Whether a load addresses, at every coordinate, what the member's store (over the same
  // shape) wrote there: the same element, or for a reduction the row's one result.
  const auto same_address = [&](const Layout& load, const Layout& stored, bool row) {
    if (load.offset != stored.offset || load.strides.size() != f.shape.size() || stored.strides.size() != f.shape.size()) {
      return false;
    }
    for (size_t d = 0; d < f.shape.size(); ++d) {
      if (f.shape[d] != 1 && load.strides[d] != (row && mask[d] ? 0 : stored.strides[d])) return false;
    }
    return true;
  };
  std::vector<size_t> g;
  std::vector<int32_t> reads;
  std::map<int32_t, std::pair<const Layout*, bool>> results;  // earlier members' outputs: (layout, a reduction's)
  bool ok = true;
  std::function<void(const Expr&)> collect = [&](const Expr& e) {
    if (e.kind == Expr::kLoad) {
      auto it = results.find(e.buffer);
      if (it == results.end()) {
        reads.push_back(e.buffer);
      } else if (!same_address(e.layout, *it->second.first, it->second.second)) {
        ok = false;
      }
    }
    for (const Expr& c : e.children) collect(c);
  };
  for (size_t ki = first; ki < p.kernels.size(); ++ki) {
    const chroma::Kernel& k = p.kernels[ki];
    const bool reduce = k.kind == chroma::Kernel::kReduce;
    if (!single(k) || k.shape != f.shape || (reduce && reduced_mask(k) != mask)) break;
    ok = true;
    collect(k.inputs[0]);
    std::vector<int32_t> w;  // what the group would store, ending here
    for (size_t m : g) {
      if (group_stores(p, p.kernels[m].outputs[0], ki)) w.push_back(p.kernels[m].outputs[0]);
    }
    if (group_stores(p, k.outputs[0], ki)) w.push_back(k.outputs[0]);
    for (size_t i = 0; ok && i < w.size(); ++i) {
      for (int32_t r : reads) ok = ok && !overlap(w[i], r);
      for (size_t j = i + 1; j < w.size(); ++j) ok = ok && !overlap(w[i], w[j]);
    }
    if (!ok) break;
    g.push_back(ki);
    // Later members read this result at their row or element without memory other
    // invocations write (resident_type); other types are read from memory, so a later reader
    // conflicts with this kernel's store and ends the group.
    if (resident_type(p.buffers[static_cast<size_t>(k.outputs[0])].type.dtype)) {
      results[k.outputs[0]] = {&k.out_layouts[0], reduce};
    }
  }
  if (g.empty() || g.back() < ri) return {first};  // no reduction: nothing shares a row
  return g;
}

// A row group (row_group) as one dispatch: workgroup `wg` takes row `wg` through every member
// in order, invocation `lid` the row's elements lid, lid + W, ... in each: a reduction folds
// the row (its result, stored by invocation 0 if group_stores, is read by the later members
// from a register); an assignment stores its elements if group_stores, and the later members
// read each back where the same invocation stored it (a 32-bit type), or compute it again (a
// half type, whose words other invocations share, or one not stored).
void t_row_group(KB& kb, const Program& p, const std::vector<size_t>& members) {
  const chroma::Kernel* f = nullptr;
  for (size_t m : members) {
    if (!f && p.kernels[m].kind == chroma::Kernel::kReduce) f = &p.kernels[m];
  }
  const Split s = split(f->shape, reduced_mask(*f));
  const int64_t R = s.extent();
  kb.k.workgroup_size = static_cast<int>(pow2_at_least(R, 32, 256));
  kb.k.workgroups = s.outputs();
  const int W = kb.k.workgroup_size;
  Block b = kb.body();
  const Ex o = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  for (size_t m = 0; m < members.size(); ++m) {
    const chroma::Kernel& lk = p.kernels[members[m]];
    const DType ot = p.buffers[static_cast<size_t>(lk.outputs[0])].type.dtype;
    const bool store = group_stores(p, lk.outputs[0], members.back());
    if (lk.kind == chroma::Kernel::kReduce) {
      const Ex total = reduce_row(kb, b, lk, p, s, "red" + std::to_string(m), store);
      kb.set_resident(lk.outputs[0], as_stored(b, ot, total));
      continue;
    }
    if (store) {
      b.loop("r", lid, lit_i(R), lit_i(W), [&](Block& in, const Ex& r) {
        const std::vector<Ex> c = merge(in, s, o, r);
        kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], c, kb.eval(in, lk.inputs[0], c));
      });
    }
    if (!store || is_half(ot)) kb.set_recomputed(lk.outputs[0], &lk.inputs[0]);
  }
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
        in.assign(total, total + call("exp", Ty::kF32, {kb.eval(in, e, merge(in, s, o, r)) - m}));
      });
      const Ex logsum = lk.attrs.log ? b.let(call("log", Ty::kF32, {total})) : nullptr;
      b.loop("r", lit_i(0), lit_i(R), lit_i(1), [&](Block& in, const Ex& r) {
        const std::vector<Ex> c = merge(in, s, o, r);
        const Ex x = in.let(kb.eval(in, e, c) - m);
        kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], c,
                 lk.attrs.log ? x - logsum : call("exp", Ty::kF32, {x}) / total);
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
    in.assign(s0, s0 + call("exp", Ty::kF32, {kb.eval(in, e, merge(in, s, o, r)) - m}));
  });
  const Ex total = kb.tree(b, s0, "red", sum, "subgroupAdd", lit_f(0));
  const Ex logsum = lk.attrs.log ? b.let(call("log", Ty::kF32, {total})) : nullptr;
  b.loop("r", lid, lit_i(R), lit_i(W), [&](Block& in, const Ex& r) {
    const std::vector<Ex> c = merge(in, s, o, r);
    const Ex x = in.let(kb.eval(in, e, c) - m);
    kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], c,
             lk.attrs.log ? x - logsum : call("exp", Ty::kF32, {x}) / total);
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
    const Ty ct = t == Ty::kBool ? Ty::kI32 : t;
    Ex better = bin(is_max ? BinOp::kGt : BinOp::kLt, convert(ct, bv), convert(ct, av));
    const Ex tie = land(eq(bv, av), lt(bi, ai));
    Ex w = lor(better, tie);
    if (t == Ty::kF32) {
      const auto nan = [](const Ex& x) {
        return gt(bitcast(Ty::kU32, x) & lit_u(0x7fffffffu), lit_u(0x7f800000u));
      };
      const Ex an = b.let(nan(av)), bn = b.let(nan(bv));
      w = select(land(lnot(an), w), select(lit_b(false), lt(bi, ai), an), bn);
    }
    return b.let(land(lt(bi, lit_i(R)), lor(ge(ai, lit_i(R)), w)));
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
    b.if_(lt(lid, lit_i(st)), [&](Block& in) {
      const Ex j = lid + lit_i(st);
      const Ex av = in.let(load_array(Space::kShared, "sv", t, lid)), ai = in.let(load_array(Space::kShared, "si", Ty::kI32, lid));
      const Ex v2 = in.let(load_array(Space::kShared, "sv", t, j)), i2 = in.let(load_array(Space::kShared, "si", Ty::kI32, j));
      in.if_(wins(in, av, ai, v2, i2), [&](Block& tb) {
        tb.shared_store("sv", lid, v2);
        tb.shared_store("si", lid, i2);
      });
    });
    b.barrier();
  }
  b.if_(eq(lid, lit_i(0)), [&](Block& in) {
    kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], merge(in, s, o, lit_i(0)), load_array(Space::kShared, "si", Ty::kI32, lit_i(0)));
  });
}

// Inclusive scan along an axis (cumsum, cumprod, cummax, cummin, logcumsumexp). Rows shorter
// than 64: one invocation per row, in order. Longer rows: one workgroup per row, so that a long
// row is not one invocation's serial walk (a cumsum over a vocabulary's probabilities): each
// invocation walks a contiguous chunk of ceil(n / W) elements for its total; the totals'
// inclusive scan across the workgroup (Hillis-Steele in workgroup memory, log2 W steps) gives
// each chunk the combination of the chunks before it, from which the invocation walks its
// chunk again, storing each element. Sums and products are then combined in another order
// than the CPU's sequential one (a few ulps of the prefix); max and min are exact.
void t_scan(KB& kb, const chroma::Kernel& lk, const Program& p) {
  std::vector<bool> mask(lk.shape.size(), false);
  mask[static_cast<size_t>(lk.attrs.axis)] = true;
  const Split s = split(lk.shape, mask);
  const Expr& e = lk.inputs[0];
  const DType ot = p.buffers[static_cast<size_t>(lk.outputs[0])].type.dtype;
  const Ty t = compute_type(ot);
  if (lk.attrs.log && t != Ty::kF32) throw Unsupported("logcumsumexp of a non-float tensor");
  // a (+) b, a the combination of the earlier elements
  auto combine = [&](Block& in, const Ex& a, const Ex& v) -> Ex {
    if (!lk.attrs.log) return combiner(lk.attrs.reduce, ot)(in, a, v);
    // log(exp(a) + exp(v)) = max + log1p(exp(min - max)); max itself where it is infinite
    // (inf - inf would be NaN: +inf absorbs anything, and -inf is the max only of -infs)
    const Ex m = in.let(map_op(in, EwOp::k_maximum, ot, {ot, ot}, {a, v}, {nullptr, nullptr}));
    const Ex lo = in.let(map_op(in, EwOp::k_minimum, ot, {ot, ot}, {a, v}, {nullptr, nullptr}));
    const Ex l1 = map_op(in, EwOp::k_log1p, ot, {ot}, {in.let(call("exp", Ty::kF32, {lo - m}))}, {nullptr});
    return select(m + l1, m, map_op(in, EwOp::k_isinf, ot, {ot}, {m}, {nullptr}));
  };
  const int64_t n = s.extent();
  // walks positions [from, to) of row o from `acc`, or from the first element where `fresh`
  // (no element before it); stores each step's value when `store`
  auto walk = [&](Block& b, const Ex& o, const Ex& from, const Ex& to, const Ex& acc, const Ex& fresh, bool store) {
    b.loop("r", from, to, lit_i(1), [&](Block& in, const Ex& r) {
      const std::vector<Ex> c = merge(in, s, o, r);
      const Ex v = in.let(cast_value(in, kb.eval(in, e, c), e.dtype, ot));
      in.assign(acc, select(combine(in, acc, v), v, land(fresh, eq(r, from))));
      if (store) kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], c, acc);
    });
  };
  if (n < 64) {
    kb.per_element(s.outputs(), [&](Block& b, const Ex& o) {
      walk(b, o, lit_i(0), lit_i(n), b.mut(t, identity(lk.attrs.reduce, t), "acc"), lit_b(true), true);
    });
    return;
  }
  const int64_t W = pow2_at_least(n, 32, 256), chunk = (n + W - 1) / W;
  kb.k.workgroup_size = static_cast<int>(W);
  kb.k.workgroups = s.outputs();
  Block b = kb.body();
  const Ex o = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  const Ex from = b.let(min(lid * lit_i(chunk), lit_i(n)), "lo");
  const Ex to = b.let(min(from + lit_i(chunk), lit_i(n)), "hi");
  const Ex tot = b.mut(t, identity(lk.attrs.reduce, t), "tot");
  walk(b, o, from, to, tot, lit_b(true), false);
  // the totals' inclusive scan (chunks past the row's end are empty and last: nothing reads
  // their identity); chunk i starts from invocation i - 1's
  kb.inclusive_scan(b, tot, "sc", combine);
  const Ex prev = max(lid - lit_i(1), lit_i(0));
  const Ex acc = b.mut(t, load_array(Space::kShared, "sc", t, prev), "acc");
  walk(b, o, from, to, acc, eq(lid, lit_i(0)), true);
}

}  // namespace chroma::gpu::internal

// Kernel templates (docs/gpu_generator.md, "Layers", B): one per lowered kernel
// kind, written once over the kernel IR. Each reads the lowered kernel's fused expressions through
// `eval` (so any fused tree, view or broadcast is read in place) and writes through the output
// layouts; none knows the dialect.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "codegen/gpu/kernel_builder.h"

namespace chroma::gpu {

namespace {

using internal::KB;
using internal::pow2_at_least;


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

// Whether the layout's elements lie row-major and contiguous from its offset.
bool row_major(const Layout& l) {
  int64_t expect = 1;
  for (size_t d = l.shape.size(); d-- > 0;) {
    if (l.shape[d] == 1) continue;
    if (l.strides[d] != expect) return false;
    expect *= l.shape[d];
  }
  return true;
}

void t_assign(KB& kb, const chroma::Kernel& lk) {
  const Expr& e = lk.inputs[0];
  const Layout& ol = lk.out_layouts[0];
  if (device_element_bytes(kb.buffer(lk.outputs[0]).type.dtype) < 4 && row_major(ol) && ol.shape == lk.shape) {
    kb.per_owned_word(&ol, lk.outputs[0], ol, numel(lk.shape),
                      [&](Block& b, const Ex& i) { return kb.eval(b, e, KB::coords_of(b, i, lk.shape)); });
    return;
  }
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
    b.if_(bin("==", lid, lit_i(0)), [&](Block& in) {
      kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], merge(in, s, o, lit_i(0)), total);
    });
  }
  return total;
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

// Whether entry (key, r) comes strictly after the previous pick (pk, pi) in top-k order (key
// descending, index ascending) and before the best so far (bk, bi; none while bi < 0).
Ex topk_candidate(const Ex& key, const Ex& r, const Ex& pk, const Ex& pi, const Ex& bk, const Ex& bi) {
  const Ex after = bin("||", bin("<", key, pk), bin("&&", bin("==", key, pk), bin(">", r, pi)));
  const Ex better = bin("||", bin("<", bi, lit_i(0)), bin("||", bin(">", key, bk), bin("&&", bin("==", key, bk), bin("<", r, bi))));
  return bin("&&", after, better);
}

// Top-k (and sort, k = n) along an axis: one invocation per row (a workgroup per wide row)
// picks the k best in order, each pass the best entry strictly after the previous pick (ties go
// to the lower index).
void t_topk(KB& kb, const chroma::Kernel& lk) {
  std::vector<bool> mask(lk.shape.size(), false);
  mask[static_cast<size_t>(lk.attrs.axis)] = true;
  const Split s = split(lk.shape, mask);
  const Expr& e = lk.inputs[0];
  const int64_t R = s.extent(), K = lk.attrs.k;
  const Ty t = compute_type(e.dtype);
  if (R >= 64 && K >= 1) {
    // Wide rows (a vocabulary's top-k, a sort): one workgroup per row. Each pass every
    // invocation finds the best entry strictly after the previous pick among its strided share
    // of the row, then two workgroup reductions (subgroup operations on CUDA and Metal: one
    // 32-lane warp or SIMD-group does most of the work) take the best key and, among the
    // invocations holding it, the lowest index: the same order and ties as below, k passes of
    // R / W reads each instead of R.
    kb.k.workgroup_size = static_cast<int>(pow2_at_least(R, 32, 256));
    kb.k.workgroups = s.outputs();
    const int W = kb.k.workgroup_size;
    Block b = kb.body();
    const Ex o = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
    const Ex pk = b.mut(Ty::kU32, lit_u(0xffffffffu), "pk");
    const Ex pi = b.mut(Ty::kI32, lit_i(-1), "pi");
    auto umax = [](Block&, Ex x, Ex y) { return call("max", Ty::kU32, {x, y}); };
    auto imin = [](Block&, Ex x, Ex y) { return call("min", Ty::kI32, {x, y}); };
    b.loop("j", lit_i(0), lit_i(K), lit_i(1), [&](Block& in, const Ex& j) {
      const Ex bk = in.mut(Ty::kU32, lit_u(0), "bk");
      const Ex bi = in.mut(Ty::kI32, lit_i(-1), "bi");
      in.loop("r", lid, lit_i(R), lit_i(W), [&](Block& l, const Ex& r) {
        const Ex v = l.let(kb.eval(l, e, merge(l, s, o, r)));
        const Ex key = order_key(l, v, lk.attrs.largest);
        l.if_(topk_candidate(key, r, pk, pi, bk, bi), [&](Block& tb) {
          tb.assign(bk, key);
          tb.assign(bi, r);
        });
      });
      // invocations without a candidate (bi < 0) take part with the lowest key and no index
      const Ex mk = kb.tree(in, in.let(select(lit_u(0), bk, bin(">=", bi, lit_i(0)))), "tk", umax, "subgroupMax", lit_u(0));
      const Ex cand = in.let(select(lit_i(INT32_MAX), bi, bin("&&", bin(">=", bi, lit_i(0)), bin("==", bk, mk))));
      const Ex mi = kb.tree(in, cand, "ti", imin, "subgroupMin", lit_i(INT32_MAX));
      in.if_(bin("==", lid, lit_i(0)), [&](Block& st) {
        const std::vector<Ex> c = merge(st, s, o, j);
        const Ex v = st.let(kb.eval(st, e, merge(st, s, o, mi)));
        kb.store(st, &lk.out_layouts[0], lk.outputs[0], lk.out_layouts[0], c, v);
        kb.store(st, &lk.out_layouts[1], lk.outputs[1], lk.out_layouts[1], c, mi);
      });
      in.assign(pk, mk);
      in.assign(pi, mi);
    });
    return;
  }
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
        l.if_(topk_candidate(key, r, pk, pi, bk, bi), [&](Block& tb) {
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
    const Ex l1 = map_op(in, EwOp::k_log1p, ot, {ot}, {in.let(call("exp", Ty::kF32, {bin("-", lo, m)}))}, {nullptr});
    return select(add(m, l1), m, map_op(in, EwOp::k_isinf, ot, {ot}, {m}, {nullptr}));
  };
  const int64_t n = s.extent();
  // walks positions [from, to) of row o from `acc`, or from the first element where `fresh`
  // (no element before it); stores each step's value when `store`
  auto walk = [&](Block& b, const Ex& o, const Ex& from, const Ex& to, const Ex& acc, const Ex& fresh, bool store) {
    b.loop("r", from, to, lit_i(1), [&](Block& in, const Ex& r) {
      const std::vector<Ex> c = merge(in, s, o, r);
      const Ex v = in.let(cast_value(in, kb.eval(in, e, c), e.dtype, ot));
      in.assign(acc, select(combine(in, acc, v), v, bin("&&", fresh, bin("==", r, from))));
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
  const Ex from = b.let(call("min", Ty::kI32, {mul(lid, lit_i(chunk)), lit_i(n)}), "lo");
  const Ex to = b.let(call("min", Ty::kI32, {add(from, lit_i(chunk)), lit_i(n)}), "hi");
  const Ex tot = b.mut(t, identity(lk.attrs.reduce, t), "tot");
  walk(b, o, from, to, tot, lit_b(true), false);
  // the totals' inclusive scan (chunks past the row's end are empty and last: nothing reads
  // their identity); chunk i starts from invocation i - 1's
  kb.inclusive_scan(b, tot, "sc", combine);
  const Ex acc = b.mut(t, load_array(Space::kShared, "sc", t, call("max", Ty::kI32, {bin("-", lid, lit_i(1)), lit_i(0)})), "acc");
  walk(b, o, from, to, acc, bin("==", lid, lit_i(0)), true);
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
      const Ex val = b.let(cast_value(b, kb.eval(b, vals, o), vals.dtype, ot));
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
  // acc combined with the value at `vc`; a float32 destination holding a half tensor's values
  // (Attrs::dtype): each step rounded
  auto fold = [&](Block& t, const Ex& acc, const std::vector<Ex>& vc) {
    const Ex c = comb(t, acc, t.let(cast_value(t, kb.eval(t, vals, vc), vals.dtype, ot)));
    t.assign(acc, ot == DType::kF32 && is_half(lk.attrs.dtype) ? cast_value(t, c, DType::kF32, lk.attrs.dtype) : c);
  };
  const Shape outer_shape(ds.begin(), ds.begin() + static_cast<std::ptrdiff_t>(axis));
  const Shape inner_shape(ds.begin() + static_cast<std::ptrdiff_t>(axis) + 1, ds.end());
  const int64_t inner = numel(inner_shape);
  if (device_element_bytes(ot) == 4 && n >= 64 && inner >= 32) {
    // Many values into wide rows (an expert's outputs added back with index_add): one workgroup
    // per destination row, which finds the values whose index names it a chunk of W indices
    // at a time (a flag each, their positions by a scan across the workgroup, the matches'
    // value indices listed in order in workgroup memory) and folds only those into the row's
    // elements, each invocation its own elements (read, combined, written back: one owner,
    // no atomics, the CPU's order). The other form below compares every index for every
    // destination element: dim x inner x n steps instead of dim x n + matches x inner.
    const int64_t W = pow2_at_least(inner, 64, 256), chunks = (n + W - 1) / W;
    kb.k.workgroup_size = static_cast<int>(W);
    kb.k.workgroups = numel(outer_shape) * dim;
    kb.add_shared("js", Ty::kI32, W);
    Block b = kb.body();
    const Ex wg = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
    const Ex row = b.let(bin("%", wg, lit_i(dim)), "row");
    const std::vector<Ex> oc = KB::coords_of(b, b.let(bin("/", wg, lit_i(dim))), outer_shape);
    auto coords = [&](Block& in, const Ex& at_axis, const Ex& i) {
      std::vector<Ex> c = oc;
      c.push_back(at_axis);
      for (const Ex& x : KB::coords_of(in, i, inner_shape)) c.push_back(x);
      return c;
    };
    b.loop("c", lit_i(0), lit_i(chunks), lit_i(1), [&](Block& cl, const Ex& ch) {
      const Ex j = cl.let(add(mul(ch, lit_i(W)), lid), "j");
      const Ex live = cl.let(bin("<", j, lit_i(n)));
      const Ex v = cl.let(kb.eval(cl, idx, {call("min", Ty::kI32, {j, lit_i(n - 1)})}), "ix");
      kb.flag_bad_index(cl, cl.let(bin("&&", live, bin("||", bin("<", v, lit_i(0)), bin(">=", v, lit_i(dim))))), v, dim,
                        lk.attrs.axis);
      const Ex match = cl.let(bin("&&", live, bin("==", v, row)), "match");
      // the matches' inclusive prefix count: a match's place in the list
      const Ex pos = kb.inclusive_scan(cl, select(lit_i(0), lit_i(1), match), "hits",
                                       [](Block&, Ex a, Ex x) { return add(a, x); });
      cl.if_(match, [&](Block& t) { t.shared_store("js", bin("-", pos, lit_i(1)), j); });
      const Ex count = cl.let(load_array(Space::kShared, "hits", Ty::kI32, lit_i(W - 1)), "count");
      cl.barrier();
      cl.if_(bin(">", count, lit_i(0)), [&](Block& cb) {
        cb.loop("i", lid, lit_i(inner), lit_i(W), [&](Block& il, const Ex& i) {
          const std::vector<Ex> dc = coords(il, row, i);
          const Ex acc = il.mut(compute_type(ot), kb.eval(il, current, dc), "acc");
          il.loop("m", lit_i(0), count, lit_i(1), [&](Block& ml, const Ex& m) {
            fold(ml, acc, coords(ml, ml.let(load_array(Space::kShared, "js", Ty::kI32, m)), i));
          });
          kb.store(il, &lk, lk.outputs[0], lk.out_layouts[0], dc, acc);
        });
      });
      // (no barrier needed before the next chunk: it rewrites `hits` only after every count
      // was read, before the barrier above, and `js` only after its own scan's barriers)
    });
    return;
  }
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
        fold(t, acc, vc);
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
  std::vector<Refusal> refusals;  // what the target lacks, per kernel (UnsupportedError)
  for (size_t ki = 0; ki < p.kernels.size(); ++ki) {
    const chroma::Kernel& lk = p.kernels[ki];
    try {
      // A float32 product the platform's BLAS computes: its library dispatch, then the
      // epilogue (if any) as a generated kernel.
      std::optional<LibraryGemm> gemm;
      if (caps.library_gemm && lk.kind == chroma::Kernel::kMatMul) gemm = internal::library_gemm_call(p, place, lk);
      if (gemm) {
        Dispatch dp;
        dp.module = -1;
        dp.library = true;
        dp.gemm = *gemm;
        dp.grid_x = dp.grid_y = 0;
        dp.slots = {place(lk.inputs[0].buffer), place(lk.inputs[1].buffer), place(lk.outputs[0])};
        dp.lowered_kernel = static_cast<int>(ki);
        dp.label = lk.label;
        dp.node = lk.name;
        dp.source = lk.source;
        out.dispatches.push_back(std::move(dp));
      }
      // A reduction and the kernels that finish its rows (a normalization): one dispatch.
      const std::vector<size_t> group = row_group(p, place, ki);
      std::string label = lk.label;
      for (size_t m = 1; m < group.size(); ++m) label += " + " + p.kernels[group[m]].label;
      // The kernel's dispatches, built with or without subgroup operations.
      auto build = [&](bool subgroups) {
      std::vector<KB> parts;
      auto make = [&](const char* what) -> KB& {
        parts.emplace_back(p, place, std::string(chroma::kernel_kind(lk.kind)) + what, 256,
                           static_cast<int>(out.dispatches.size() + parts.size()), subgroups);
        parts.back().split_k = caps.split_k;
        return parts.back();
      };
      if (group.size() > 1) {
        t_row_group(make("_rows"), p, group);
        return parts;
      }
      switch (lk.kind) {
        case chroma::Kernel::kAssign: t_assign(make(""), lk); break;
        case chroma::Kernel::kConcat: t_concat(make(""), lk); break;
        case chroma::Kernel::kReduce: t_reduce(make(""), lk, p); break;
        case chroma::Kernel::kSoftmax: t_softmax(make(""), lk); break;
        case chroma::Kernel::kArgReduce: t_arg_reduce(make(""), lk); break;
        case chroma::Kernel::kMatMul:
          if (gemm) internal::t_product_epilogue(make("_epilogue"), lk);
          else internal::t_matmul(make(""), lk);
          break;
        case chroma::Kernel::kGather:
        case chroma::Kernel::kGatherElements: t_gather(make(""), lk); break;
        case chroma::Kernel::kTopK: t_topk(make(""), lk); break;
        case chroma::Kernel::kScan: t_scan(make(""), lk, p); break;
        case chroma::Kernel::kConv: internal::t_conv(make(""), lk); break;
        case chroma::Kernel::kIndexPut: {
          const Buffer& ob = p.buffers[static_cast<size_t>(lk.outputs[0])];
          if (!lk.index_put().in_place && numel(ob.type.shape) > 0) {  // the base first, as an assign
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
          (group.size() > 1 || lk.kind == chroma::Kernel::kReduce || lk.kind == chroma::Kernel::kSoftmax)) {
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
        dp.label = label;
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
      ki = group.back();  // the group's later members ran in its dispatch
    } catch (const Unsupported& e) {
      refusals.push_back({std::string(chroma::kernel_kind(lk.kind)) + " '" + lk.label + "'", lk.name, lk.source, e.what()});
    } catch (const CompileError& e) {
      errors.push_back("  " + std::string(chroma::kernel_kind(lk.kind)) + " '" + lk.label + "' (node " + lk.name + "): " + e.what());
    }
  }
  if (!errors.empty()) {  // not a missing capability: the program itself is at fault
    std::string all = "target '" + d.name + "': " + std::to_string(errors.size()) + " kernel(s) cannot be compiled:\n";
    for (const std::string& e : errors) all += e + "\n";
    throw CompileError(all);
  }
  if (!refusals.empty()) throw UnsupportedError(d.name, std::move(refusals));
  return out;
}

}  // namespace chroma::gpu

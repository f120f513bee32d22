// Gathers, top-k and scatters (docs/gpu_generator.md, "Layers", B; declared in templates.h):
// index_select, embedding and gather with the status block's bad-index report; top-k and sort
// by order keys; index_put, index_copy and scatter, accumulating ones deterministically
// without atomics.
#include <cstdint>
#include <vector>

#include "codegen/gpu/templates.h"

namespace chroma::gpu::internal {

namespace {

// An order key: larger keys come first. Floats map to a monotone u32 (NaN first when
// largest, last when smallest, as the CPU's top-k); integers flip the sign bit.
Ex order_key(Block& b, const Ex& v, bool largest) {
  Ex key;
  if (v->ty == Ty::kF32) {
    const Ex u = b.let(bitcast(Ty::kU32, v));
    const Ex nan = gt(u & lit_u(0x7fffffffu), lit_u(0x7f800000u));
    // -0 and +0 are equal (a tie, decided by index)
    const Ex z = b.let(select(u, lit_u(0), eq(u & lit_u(0x7fffffffu), lit_u(0))));
    const Ex mono = select(z | lit_u(0x80000000u), ~z, ne(z >> lit_u(31), lit_u(0)));
    key = largest ? select(mono, lit_u(0xffffffffu), nan) : select(~mono, lit_u(0), nan);
    return b.let(key);
  }
  const Ex u = bitcast(Ty::kU32, convert(Ty::kI32, v)) ^ lit_u(0x80000000u);
  return b.let(largest ? u : ~u);
}

// Whether entry (key, r) comes strictly after the previous pick (pk, pi) in top-k order (key
// descending, index ascending) and before the best so far (bk, bi; none while bi < 0).
Ex topk_candidate(const Ex& key, const Ex& r, const Ex& pk, const Ex& pi, const Ex& bk, const Ex& bi) {
  const Ex after = lor(lt(key, pk), land(eq(key, pk), gt(r, pi)));
  const Ex better = lor(lt(bi, lit_i(0)), lor(gt(key, bk), land(eq(key, bk), lt(r, bi))));
  return land(after, better);
}

}  // namespace

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
    const Ex bad = b.let(lor(lt(v, lit_i(0)), ge(v, lit_i(dim))));
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
    auto umax = [](Block&, Ex x, Ex y) { return max(x, y); };
    auto imin = [](Block&, Ex x, Ex y) { return min(x, y); };
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
      const Ex mk = kb.tree(in, in.let(select(lit_u(0), bk, ge(bi, lit_i(0)))), "tk", umax, "subgroupMax", lit_u(0));
      const Ex cand = in.let(select(lit_i(INT32_MAX), bi, land(ge(bi, lit_i(0)), eq(bk, mk))));
      const Ex mi = kb.tree(in, cand, "ti", imin, "subgroupMin", lit_i(INT32_MAX));
      in.if_(eq(lid, lit_i(0)), [&](Block& st) {
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
      const Ex bad = b.let(lor(lt(v, lit_i(0)), ge(v, lit_i(dim))));
      kb.flag_bad_index(b, bad, v, dim, lk.attrs.axis);
      const Ex val = b.let(cast_value(b, kb.eval(b, vals, o), vals.dtype, ot));
      b.if_(lnot(bad), [&](Block& t) {
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
    const Ex row = b.let(wg % lit_i(dim), "row");
    const std::vector<Ex> oc = KB::coords_of(b, b.let(wg / lit_i(dim)), outer_shape);
    auto coords = [&](Block& in, const Ex& at_axis, const Ex& i) {
      std::vector<Ex> c = oc;
      c.push_back(at_axis);
      for (const Ex& x : KB::coords_of(in, i, inner_shape)) c.push_back(x);
      return c;
    };
    b.loop("c", lit_i(0), lit_i(chunks), lit_i(1), [&](Block& cl, const Ex& ch) {
      const Ex j = cl.let(ch * lit_i(W) + lid, "j");
      const Ex live = cl.let(lt(j, lit_i(n)));
      const Ex v = cl.let(kb.eval(cl, idx, {min(j, lit_i(n - 1))}), "ix");
      kb.flag_bad_index(cl, cl.let(land(live, lor(lt(v, lit_i(0)), ge(v, lit_i(dim))))), v, dim,
                        lk.attrs.axis);
      const Ex match = cl.let(land(live, eq(v, row)), "match");
      // the matches' inclusive prefix count: a match's place in the list
      const Ex pos = kb.inclusive_scan(cl, select(lit_i(0), lit_i(1), match), "hits",
                                       [](Block&, Ex a, Ex x) { return a + x; });
      cl.if_(match, [&](Block& t) { t.shared_store("js", pos - lit_i(1), j); });
      const Ex count = cl.let(load_array(Space::kShared, "hits", Ty::kI32, lit_i(W - 1)), "count");
      cl.barrier();
      cl.if_(gt(count, lit_i(0)), [&](Block& cb) {
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
      const Ex bad = in.let(lor(lt(v, lit_i(0)), ge(v, lit_i(dim))));
      kb.flag_bad_index(in, bad, v, dim, lk.attrs.axis);
      in.if_(eq(v, dc[axis]), [&](Block& t) {
        std::vector<Ex> vc = dc;
        vc[axis] = j;
        fold(t, acc, vc);
      });
    });
    kb.store(b, &lk, lk.outputs[0], lk.out_layouts[0], dc, acc);
  });
}

}  // namespace chroma::gpu::internal

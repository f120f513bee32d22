// The attention template (Kernel::kAttention, passes/fuse_attention.h): softmax(q kt (*|/)
// scale + bias) v in one dispatch that never stores the scores, as FlashAttention computes it
// (docs/gpu_generator.md, "Attention in one kernel"). One workgroup per (batch, block of query
// rows), one invocation per row: each keeps its query row, the running maximum, the running
// sum of exponentials and its unnormalized output row in registers; the workgroup streams
// the keys and values through workgroup memory a block of keys at a time. A row needs no
// other invocation's values, so the online softmax has no workgroup reductions and the only
// barriers are the two around each block's tiles.
#include <cmath>
#include <limits>

#include "codegen/gpu/templates.h"

namespace chroma::gpu::internal {

namespace {

Ex bits(const Ex& x) { return bitcast(Ty::kU32, x); }
// x is -inf (a bit test: WGSL may assume no infinities in float comparisons).
Ex is_minus_inf(const Ex& x) { return eq(bits(x), lit_u(0xff800000u)); }

}  // namespace

int64_t attention_key_block(int64_t d, int64_t e, int64_t max_shared_bytes) {
  int64_t bc = 64;
  while (bc > 1 && bc * std::max<int64_t>(d + e, 1) * 4 > max_shared_bytes) bc /= 2;
  return bc;
}

void t_attention(KB& kb, const chroma::Kernel& lk, int64_t max_shared_bytes) {
  const size_t r = lk.shape.size();
  const Expr &q = lk.inputs[0], &kt = lk.inputs[1], &v = lk.inputs[2];
  const Expr* bias = lk.inputs.size() > 3 ? &lk.inputs[3] : nullptr;
  for (const Expr& e : lk.inputs) {
    if (compute_type(e.dtype) != Ty::kF32) throw Unsupported("attention over a non-float32 tensor");
  }
  const int64_t L = lk.shape[r - 2], E = lk.shape[r - 1], D = q.layout.shape[r - 1], S = kt.layout.shape[r - 1];
  if (D > kAttentionMaxWidth || E > kAttentionMaxWidth) {
    throw Unsupported("attention with rows of " + std::to_string(std::max(D, E)) + " values (at most " +
                      std::to_string(kAttentionMaxWidth) + " in one kernel)");
  }
  if (numel(lk.shape) == 0) return;
  if (S == 0) {  // an empty softmax times an empty matrix: zeros, as the unfused product gives
    kb.per_element(numel(lk.shape), [&](Block& b, const Ex& i) {
      kb.store(b, &lk, lk.outputs[0], lk.out_layouts[0], KB::coords_of(b, i, lk.shape), lit_f(0));
    });
    return;
  }
  const Shape batch(lk.shape.begin(), lk.shape.end() - 2);
  const int W = static_cast<int>(pow2_at_least(L, 32, 64));  // query rows per workgroup
  const int64_t blocks = (L + W - 1) / W;
  const int64_t BC = attention_key_block(D, E, max_shared_bytes);  // keys per block
  kb.k.workgroup_size = W;
  kb.k.workgroups = numel(batch) * blocks;
  kb.add_shared("ks", Ty::kF32, std::max<int64_t>(BC * D, 1));
  kb.add_shared("vs", Ty::kF32, BC * E);
  Block b = kb.body();
  const Ex wg = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  const Ex bi = b.let(blocks == 1 ? wg : wg / lit_i(blocks), "bi");
  std::vector<Ex> bc = KB::coords_of(b, bi, batch);
  const Ex row = b.let((blocks == 1 ? lit_i(0) : (wg % lit_i(blocks)) * lit_i(W)) + lid, "row");
  // Rows past L compute on row L - 1 and store nothing: every invocation runs the same loops,
  // with no divergent control flow around them.
  const Ex rr = L % W == 0 ? row : b.let(min(row, lit_i(L - 1)), "rr");
  auto at = [&](const Ex& x, const Ex& y) {
    std::vector<Ex> c = bc;
    c.push_back(x);
    c.push_back(y);
    return c;
  };
  auto priv = [](const char* name, const Ex& i) { return load_array(Space::kPrivate, name, Ty::kF32, i); };
  auto shared = [](const char* name, const Ex& i) { return load_array(Space::kShared, name, Ty::kF32, i); };
  const auto mx = combiner(ReduceKind::kMax, DType::kF32);
  const double inf = std::numeric_limits<double>::infinity();

  // This invocation's query row and its output row (unnormalized) in registers, the loops
  // over D and E unrolled, and a block's scores. Unrolled, they also keep the loops' iterations
  // per invocation to about 5 per key: Mesa's lavapipe ends a shader's loops silently once
  // they have iterated 65535 times in all in one invocation (LP_MAX_TGSI_LOOP_ITERATIONS), which
  // loops over D and E inside the loop over keys passed at 480 keys of 64-wide heads.
  std::vector<Ex> qd, acc;
  for (int64_t d = 0; d < D; ++d) qd.push_back(b.let(kb.eval(b, q, at(rr, lit_i(d))), "q"));
  for (int64_t e = 0; e < E; ++e) acc.push_back(b.mut(Ty::kF32, lit_f(0), "a"));
  b.array("sv", Ty::kF32, BC);
  const Ex m = b.mut(Ty::kF32, lit_f(-inf), "m");  // running maximum
  const Ex total = b.mut(Ty::kF32, lit_f(0), "l");  // running sum of exponentials

  b.loop("j0", lit_i(0), lit_i(S), lit_i(BC), [&](Block& kl, const Ex& j0) {
    // The block's keys and values into workgroup memory (zeros past the last key).
    auto tile = [&](const char* name, const Expr& x, int64_t width, bool keys) {
      const int64_t n = BC * width;
      if (n == 0) return;
      kl.loop("it", lit_i(0), lit_i((n + W - 1) / W), lit_i(1), [&](Block& l, const Ex& it) {
        const Ex t = l.let(it * lit_i(W) + lid, "t");
        const Ex j = l.let(t / lit_i(width)), c = l.let(t % lit_i(width));
        const Ex key = l.let(j0 + j, "key");
        const Ex kc = S % BC == 0 ? key : l.let(min(key, lit_i(S - 1)));
        const Ex val = l.let(kb.eval(l, x, keys ? at(c, kc) : at(kc, c)));
        auto put = [&](Block& in) { in.shared_store(name, t, S % BC == 0 ? val : select(val, lit_f(0), ge(key, lit_i(S)))); };
        if (n % W == 0) put(l);
        else l.if_(lt(t, lit_i(n)), put);
      });
    };
    tile("ks", kt, D, true);
    tile("vs", v, E, false);
    kl.barrier();
    const Ex n = S % BC == 0 ? lit_i(BC) : kl.let(min(lit_i(BC), lit_i(S) - j0), "n");
    // The block's scores, scaled and biased as the unfused graph computes them.
    const Ex bmax = kl.mut(Ty::kF32, lit_f(-inf), "bm");
    kl.loop("j", lit_i(0), n, lit_i(1), [&](Block& l, const Ex& j) {
      const Ex dot = l.mut(Ty::kF32, lit_f(0), "dot");
      const Ex kj = D > 1 ? l.let(j * lit_i(D)) : j;
      for (int64_t d = 0; d < D; ++d) l.assign(dot, dot + qd[static_cast<size_t>(d)] * shared("ks", kj + lit_i(d)));
      const Ex sc = lit_f(static_cast<float>(lk.attrs.scalar.as_double()));
      Ex s = l.let(map_op(l, lk.attrs.k ? EwOp::k_div : EwOp::k_mul, DType::kF32, {DType::kF32, DType::kF32}, {dot, sc},
                          {nullptr, nullptr}), "s");
      if (bias) {
        const Ex bv = l.let(kb.eval(l, *bias, at(rr, j0 + j)));
        s = l.let(map_op(l, EwOp::k_add, DType::kF32, {DType::kF32, DType::kF32}, {s, bv}, {nullptr, nullptr}), "s");
      }
      l.assign_elem("sv", j, s);
      l.assign(bmax, mx(l, bmax, s));
    });
    // The online softmax, without branches: while every score so far is -inf the exponentials
    // are taken against 0 (exp(-inf) = 0: nothing is added, and the row ends as 0 / 0, NaN, as
    // softmax gives it).
    const Ex m_new = kl.let(mx(kl, m, bmax), "mn");
    const Ex base = kl.let(select(m_new, lit_f(0), is_minus_inf(m_new)), "mb");
    const Ex corr = kl.let(select(call("exp", Ty::kF32, {m - base}), lit_f(0), is_minus_inf(m)), "corr");
    const Ex sum = kl.mut(Ty::kF32, lit_f(0), "sum");
    kl.loop("j", lit_i(0), n, lit_i(1), [&](Block& l, const Ex& j) {
      const Ex p = l.let(call("exp", Ty::kF32, {priv("sv", j) - base}), "p");
      l.assign_elem("sv", j, p);
      l.assign(sum, sum + p);
    });
    kl.assign(total, total * corr + sum);
    kl.assign(m, m_new);
    for (const Ex& a : acc) kl.assign(a, a * corr);
    kl.loop("j", lit_i(0), n, lit_i(1), [&](Block& l, const Ex& j) {
      const Ex p = l.let(priv("sv", j), "p");
      const Ex vj = E > 1 ? l.let(j * lit_i(E)) : j;
      for (int64_t e = 0; e < E; ++e) l.assign(acc[static_cast<size_t>(e)], acc[static_cast<size_t>(e)] + p * shared("vs", vj + lit_i(e)));
    });
    kl.barrier();  // the tiles are rewritten by the next block
  });

  // out = acc / l; NaN where the softmax is NaN: every score -inf (l = 0), or a NaN or +inf
  // score (the maximum is then NaN or +inf, and eager's exp(inf - inf) is NaN).
  const Ex bad = b.let(lor(eq(bits(total), lit_u(0)), ge(bits(m) & lit_u(0x7fffffffu), lit_u(0x7f800000u))), "bad");
  auto put = [&](Block& in) {
    for (int64_t e = 0; e < E; ++e) {
      const Ex out = in.let(select(acc[static_cast<size_t>(e)] / total, lit_f(std::nan("")), bad), "o");
      kb.store(in, &lk, lk.outputs[0], lk.out_layouts[0], at(row, lit_i(e)), out);
    }
  };
  if (L % W == 0) put(b);
  else b.if_(lt(row, lit_i(L)), put);
}

}  // namespace chroma::gpu::internal

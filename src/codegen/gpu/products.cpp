// The GPU templates of matrix products and convolutions (docs/gpu_generator.md, "Layers",
// B): a memory-bound kernel for products with few rows or columns, one workgroup-tiled
// product (tiled_gemm) that matrix products and im2col convolutions share, and direct convolutions.
#include <algorithm>
#include <functional>
#include <numeric>
#include <vector>

#include "codegen/gpu/kernel_builder.h"

namespace chroma::gpu::internal {

namespace {

// Whether B, the large operand of a product with few rows, is a grouped weight whose columns
// are its stored rows: B[batch..., k, l] at dense element row * K + k, the row a function of
// (batch, l) alone (a linear layer's [N, K] weight read transposed, a batch of experts).
bool grouped_rows(const Expr& B, size_t nbatch, int64_t K) {
  if (B.kind != Expr::kLoad || B.quant == quant::Format::kF32 || B.quant_k != K || K % quant::kGroup != 0) return false;
  const Layout& l = B.layout;
  if (l.offset != 0 || l.strides.size() != nbatch + 2 || l.shape.size() != nbatch + 2) return false;
  if (l.shape[nbatch] > 1 && l.strides[nbatch] != 1) return false;
  for (size_t d = 0; d < l.strides.size(); ++d) {
    if (d != nbatch && l.shape[d] > 1 && l.strides[d] % K != 0) return false;
  }
  return true;
}

// How a skinny product (t_matmul_skinny) spreads over a workgroup: Wc columns, C each (Wc
// apart), times S slices of K's `steps` (S = 1: no split).
struct SkinnySpread {
  int64_t Wc, C, S;
};

SkinnySpread skinny_spread(bool split_k, int64_t L, int64_t nb, int64_t steps, bool grouped) {
  int64_t Wc = pow2_at_least(L, 64, 256), C = L >= 16 * Wc ? 4 : 1, S = 1;
  // the split: fewer than kFewInvocations without it, and at least kMinSlice steps of K (a
  // grouped weight's groups of 64) per slice
  constexpr int64_t kFewInvocations = 16384, kMinSlice = 16;
  const int64_t min_slice = grouped ? 1 : kMinSlice;
  if (split_k && nb * ((L + Wc * C - 1) / (Wc * C)) * Wc < kFewInvocations && steps >= 2 * min_slice) {
    const int64_t wc = pow2_at_least(L, 8, 32);
    int64_t s = 1;
    while (s * 2 * wc <= 256 && steps / (s * 2) >= min_slice) s *= 2;
    if (s > 1) {
      Wc = wc;
      C = 1;
      S = s;
    }
  }
  return {Wc, C, S};
}

// A skinny product's (t_matmul_skinny) walk over its large operand, groups [s0, s1) of K, when
// it is a grouped weight (Expr::quant; quant::pack_rows, docs/quantization.md) whose large
// index l is a stored row (grouped_rows): each invocation walks its columns' rows (`clamped`)
// a group at a time, the group's header (float16 scale and bias) read once per 64 weights,
// each word of values once, the values decoded from it with constant shifts; `accumulate(in,
// k, lv)` adds the columns' values lv at step k to their sums. A chunk is the fewest words that
// hold whole values (q4, q8: one word of 8 or 4; q6: three words of 16). The same arithmetic
// per weight as KB::dequantize, in the same order.
void accumulate_grouped_rows(KB& kb, Block& b, const Expr& B, const Shape& batch, const std::vector<Ex>& bc, int64_t K,
                             const std::vector<Ex>& clamped, const Ex& s0, const Ex& s1,
                             const std::function<void(Block&, const Ex&, const std::vector<Ex>&)>& accumulate) {
  const int64_t C = static_cast<int64_t>(clamped.size());
  const int bits = quant::format_bits(B.quant);
  const int64_t group_words = KB::quant_group_words(bits), row_words = K / quant::kGroup * group_words;
  const int64_t chunk_words = bits / std::gcd(bits, 32);
  const int64_t chunk_values = 32 * chunk_words / bits, chunks = quant::kGroup / chunk_values;
  const std::pair<int, Ex> sb = kb.base(&B, B.buffer, 0, false);  // a uint8 buffer: counted in bytes
  const int s = sb.first;
  const Ex word0 = b.let(sb.second >> lit_i(2));
  std::vector<int64_t> row_strides = B.layout.strides;
  row_strides[batch.size()] = 0;  // the k stride (1): the rest addresses whole rows
  std::vector<Ex> row_at;  // each column's first word
  for (int64_t j = 0; j < C; ++j) {
    std::vector<Ex> c = bc;
    c.push_back(lit_i(0));
    c.push_back(clamped[static_cast<size_t>(j)]);
    const Ex row = b.let(KB::address(lit_i(0), row_strides, c) / lit_i(K));
    row_at.push_back(b.let(word0 + row * lit_i(row_words), "rw"));
  }
  const Ex mask = lit_u((1u << bits) - 1u);
  b.loop("g", s0, s1, lit_i(1), [&](Block& gl, const Ex& gi) {
    std::vector<Ex> gw, scale, bias;
    for (int64_t j = 0; j < C; ++j) {
      gw.push_back(gl.let(row_at[static_cast<size_t>(j)] + gi * lit_i(group_words), "gw"));
      const std::pair<Ex, Ex> sc = KB::group_header(gl, s, gw.back());
      scale.push_back(sc.first);
      bias.push_back(sc.second);
    }
    const Ex k0 = gl.let(gi * lit_i(quant::kGroup), "k0");
    gl.loop("ch", lit_i(0), lit_i(chunks), lit_i(1), [&](Block& in, const Ex& ch) {
      std::vector<std::vector<Ex>> words(static_cast<size_t>(C));
      for (int64_t j = 0; j < C; ++j) {
        const Ex w0 = in.let(gw[static_cast<size_t>(j)] + lit_i(1) + ch * lit_i(chunk_words));
        for (int64_t w = 0; w < chunk_words; ++w) words[static_cast<size_t>(j)].push_back(in.let(load_word(s, w0 + lit_i(w)), "qw"));
      }
      const Ex kc = in.let(k0 + ch * lit_i(chunk_values), "kc");
      for (int64_t v = 0; v < chunk_values; ++v) {
        const int64_t bit = v * bits, wi = bit / 32, sh = bit % 32;
        std::vector<Ex> lv;
        for (int64_t j = 0; j < C; ++j) {
          const std::vector<Ex>& wj = words[static_cast<size_t>(j)];
          Ex q = sh ? wj[static_cast<size_t>(wi)] >> lit_u(static_cast<uint64_t>(sh)) : wj[static_cast<size_t>(wi)];
          if (sh + bits > 32) q = q | (wj[static_cast<size_t>(wi + 1)] << lit_u(static_cast<uint64_t>(32 - sh)));
          const Ex qv = in.let(convert(Ty::kF32, q & mask));
          lv.push_back(in.let(scale[static_cast<size_t>(j)] * qv + bias[static_cast<size_t>(j)]));
        }
        accumulate(in, in.let(kc + lit_i(v)), lv);
      }
    });
  });
}

// A product with few rows (M <= 8, `rows`) or few columns (N <= 8): the R = M (or N) sums of
// each column (row) of the large dimension stay in registers, so the large operand is read
// once (memory-bound: the unembedding of a decoder, a GEMV). Each invocation owns C columns Wc
// apart, so consecutive invocations read consecutive elements of a row-major operand; the
// small operand (R x K) is staged in workgroup memory once per workgroup when it fits, so the
// inner loop reads R values from it per C loads of the large operand.
//
// When the columns alone would launch few invocations (a decoder's projections and experts at
// a few tokens: one to a dozen workgroups, each invocation walking all of K with a dependent
// global load per step), K is split too: the workgroup's W invocations are Wc columns x S
// slices of K, each slice sums its own range, and row r's S partial sums meet in workgroup
// memory, added in slice order by slice r % S (deterministic; the order of the sum changes).
// A GPU then runs S times the invocations, each with an S times shorter chain of loads.
void t_matmul_skinny(KB& kb, const chroma::Kernel& lk, bool rows, Ty t, const Shape& batch, int64_t M, int64_t N,
                     int64_t K) {
  const Expr& A = lk.inputs[0];
  const Expr& B = lk.inputs[1];
  const int64_t R = rows ? M : N, L = rows ? N : M, nb = numel(batch);
  const bool grouped = rows && grouped_rows(B, batch.size(), K);
  const int64_t steps = grouped ? K / quant::kGroup : K;
  const SkinnySpread spread = skinny_spread(kb.split_k, L, nb, steps, grouped);
  const int64_t Wc = spread.Wc, C = spread.C, S = spread.S;
  const int W = static_cast<int>(Wc * S);
  const int64_t groups = (L + Wc * C - 1) / (Wc * C);
  if (nb * groups >= (1ll << 31) || nb * M * N >= (1ll << 31)) throw Unsupported("more than 2^31 elements in one kernel");
  kb.k.workgroup_size = W;
  kb.k.workgroups = std::max<int64_t>(1, nb * groups);
  const bool staged = R * K * 4 <= 8192;
  // the split's partial sums ([slice][row][column]: S x R x Wc) reuse the staged operand's space
  const int64_t parts = S > 1 ? S * R * Wc : 0;
  if (staged || parts > 0) kb.add_shared("sm", t, std::max(staged ? R * K : 0, parts));
  Block b = kb.body();
  const Ex wg = var("wg", Ty::kI32), lid = var("lid", Ty::kI32);
  const Ex bt = b.let(wg / lit_i(groups)), g = b.let(wg % lit_i(groups));
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
    b.loop("s", lid, lit_i(R * K), lit_i(W), [&](Block& in, const Ex& si) {
      in.shared_store("sm", si, small(in, in.let(si / lit_i(K)), in.let(si % lit_i(K))));
    });
    b.barrier();
  }
  // this invocation's column within the workgroup's Wc, and its slice of K (steps [s0, s1))
  const Ex lc = S > 1 ? b.let(lid % lit_i(Wc), "lc") : lid;
  const Ex slice = S > 1 ? b.let(lid / lit_i(Wc), "slice") : lit_i(0);
  const int64_t per_slice = (steps + S - 1) / S;
  const Ex s0 = S > 1 ? b.let(slice * lit_i(per_slice), "s0") : lit_i(0);
  const Ex s1 = S > 1 ? b.let(min(s0 + lit_i(per_slice), lit_i(steps)), "s1") : lit_i(steps);
  std::vector<Ex> col, valid, clamped;
  for (int64_t j = 0; j < C; ++j) {
    col.push_back(b.let(g * lit_i(Wc * C) + lit_i(j * Wc) + lc, "l"));
    valid.push_back(b.let(lt(col.back(), lit_i(L))));
    clamped.push_back(b.let(min(col.back(), lit_i(L - 1))));  // every read in bounds
  }
  std::vector<std::vector<Ex>> acc(static_cast<size_t>(R));
  for (auto& row : acc) {
    for (int64_t j = 0; j < C; ++j) row.push_back(b.mut(t, lit(t, 0), "acc"));
  }
  // acc[r][j] += small(r, k) * lv[j], for every row r
  auto accumulate = [&](Block& in, const Ex& k, const std::vector<Ex>& lv) {
    for (int64_t r = 0; r < R; ++r) {
      const Ex sv = in.let(staged ? load_array(Space::kShared, "sm", t, lit_i(r * K) + k) : small(in, lit_i(r), k));
      for (int64_t j = 0; j < C; ++j) {
        Ex& a = acc[static_cast<size_t>(r)][static_cast<size_t>(j)];
        in.assign(a, a + (rows ? sv * lv[static_cast<size_t>(j)] : lv[static_cast<size_t>(j)] * sv));
      }
    }
  };
  if (grouped) {
    accumulate_grouped_rows(kb, b, B, batch, bc, K, clamped, s0, s1, accumulate);
  } else {
    b.loop("k", s0, s1, lit_i(1), [&](Block& in, const Ex& k) {
      std::vector<Ex> lv;
      for (int64_t j = 0; j < C; ++j) lv.push_back(in.let(large(in, k, clamped[static_cast<size_t>(j)])));
      accumulate(in, k, lv);
    });
  }
  if (S > 1) {
    // Every slice's partial sums to workgroup memory; then the slice r % S adds row r's S
    // partials in slice order and stores the total (one barrier; the rows' sums in parallel).
    if (staged) b.barrier();  // every slice is done reading the staged operand
    const Ex part_at = b.let(slice * lit_i(R * Wc) + lc, "pi");
    for (int64_t r = 0; r < R; ++r) b.shared_store("sm", part_at + lit_i(r * Wc), acc[static_cast<size_t>(r)][0]);
    b.barrier();
    for (int64_t r = 0; r < R; ++r) {
      b.if_(land(eq(slice, lit_i(r % S)), valid[0]), [&](Block& in) {
        Ex v = in.let(load_array(Space::kShared, "sm", t, lit_i(r * Wc) + lc));
        for (int64_t q = 1; q < S; ++q) v = in.let(v + load_array(Space::kShared, "sm", t, lit_i((q * R + r) * Wc) + lc));
        std::vector<Ex> c = bc;
        c.push_back(rows ? lit_i(r) : col[0]);
        c.push_back(rows ? col[0] : lit_i(r));
        kb.store_result(in, lk, c, v);
      });
    }
    return;
  }
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
  // declared (the figures: bench/results/README.md).
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
  const Ex bt = b.let(wg / lit_i(tm * tn), "bt");
  const Ex tile = b.let(wg % lit_i(tm * tn));
  const Ex m0 = b.let(tile / lit_i(tn) * lit_i(BM), "m0");
  const Ex n0 = b.let(tile % lit_i(tn) * lit_i(BN), "n0");
  const Ex ty = b.let(lid / lit_i(T)), tx = b.let(lid % lit_i(T));
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
      const Ex idx = l.let(lid + step * lit_i(T * T));
      auto body = [&](Block& bb) {
        const Ex r = bb.let(inner_fastest ? idx / lit_i(cols) : idx % lit_i(rows));
        const Ex c = bb.let(inner_fastest ? idx % lit_i(cols) : idx / lit_i(rows));
        bb.shared_store(name, r * lit_i(cols) + c, at(bb, r, c));
      };
      if (count % (T * T) == 0) body(l);
      else l.if_(lt(idx, lit_i(count)), body);
    });
  };
  b.loop("k0", lit_i(0), lit_i(g.K), lit_i(BK), [&](Block& in, const Ex& k0) {
    stage(in, "ta", BM, BK, g.a_k_fastest, [&](Block& l, const Ex& mm, const Ex& kk) {
      const Ex gm = l.let(m0 + mm), gk = l.let(k0 + kk);
      const Ex v = l.mut(t, lit(t, 0), "av");
      l.if_(land(lt(gm, lit_i(g.M)), lt(gk, lit_i(g.K))), [&](Block& tb) { tb.assign(v, g.a(tb, gm, gk)); });
      return v;
    });
    stage(in, "tb", BK, BN, g.b_n_fastest, [&](Block& l, const Ex& kk, const Ex& nn) {
      const Ex gk = l.let(k0 + kk), gn = l.let(n0 + nn);
      const Ex v = l.mut(t, lit(t, 0), "bv");
      l.if_(land(lt(gk, lit_i(g.K)), lt(gn, lit_i(g.N))), [&](Block& tb) { tb.assign(v, g.b(tb, gk, gn)); });
      return v;
    });
    in.barrier();
    in.loop("kk", lit_i(0), lit_i(BK), lit_i(1), [&](Block& l, const Ex& kk) {
      std::vector<Ex> av, bv;
      for (int64_t i = 0; i < RM; ++i) {
        av.push_back(l.let(load_array(Space::kShared, "ta", t, (ty + lit_i(i * T)) * lit_i(BK) + kk), "a"));
      }
      for (int64_t j = 0; j < RN; ++j) {
        bv.push_back(l.let(load_array(Space::kShared, "tb", t, kk * lit_i(BN) + tx + lit_i(j * T)), "b"));
      }
      for (int64_t i = 0; i < RM; ++i) {
        for (int64_t j = 0; j < RN; ++j) {
          const Ex ai = lit_i(i * RN + j);
          l.assign_elem("acc", ai, load_array(Space::kPrivate, "acc", t, ai) + av[static_cast<size_t>(i)] * bv[static_cast<size_t>(j)]);
        }
      }
    });
    in.barrier();
  });
  b.loop("o", lit_i(0), lit_i(RM * RN), lit_i(1), [&](Block& l, const Ex& i) {
    const Ex gm = l.let(m0 + ty + i / lit_i(RN) * lit_i(T), "gm");
    const Ex gn = l.let(n0 + tx + i % lit_i(RN) * lit_i(T), "gn");
    l.if_(land(lt(gm, lit_i(g.M)), lt(gn, lit_i(g.N))),
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

}  // namespace

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

std::optional<LibraryGemm> library_gemm_call(const Program& p, const std::function<Placement(int32_t)>& place,
                                             const chroma::Kernel& lk) {
  const Expr& A = lk.inputs[0];
  const Expr& B = lk.inputs[1];
  if (A.kind != Expr::kLoad || B.kind != Expr::kLoad || A.dtype != DType::kF32 || B.dtype != DType::kF32) return std::nullopt;
  if (A.quant != quant::Format::kF32 || B.quant != quant::Format::kF32) return std::nullopt;  // grouped weights: generated
  const Buffer& cb = p.buffers[static_cast<size_t>(lk.outputs[0])];
  if (cb.type.dtype != DType::kF32) return std::nullopt;
  const size_t r = lk.shape.size();
  if (r < 2) return std::nullopt;
  LibraryGemm g;
  g.m = lk.shape[r - 2];
  g.n = lk.shape[r - 1];
  g.k = A.shape()[r - 1];
  if (g.m <= 8 || g.n <= 8 || g.k < 1) return std::nullopt;  // the memory-bound kernel's products
  // Small products stay generated: one fused kernel launch beats a library call plus an
  // epilogue kernel when there is little arithmetic to share out (below 64^3 multiply-adds).
  if (g.m * g.n * g.k * numel(Shape(lk.shape.begin(), lk.shape.end() - 2)) < (int64_t{1} << 18)) return std::nullopt;
  // Batch dimensions: at most one of extent > 1 (a uniform batch stride for every operand).
  int bdim = -1;
  for (size_t d = 0; d + 2 < r; ++d) {
    if (lk.shape[d] == 1) continue;
    if (bdim >= 0) return std::nullopt;
    bdim = static_cast<int>(d);
  }
  g.batch = bdim < 0 ? 1 : lk.shape[static_cast<size_t>(bdim)];
  // One operand over `strides` (of the product's rank): its word offset and strides, with an
  // extent-1 dimension's stride set so that the matrix is plainly row- or column-major.
  auto operand = [&](int32_t buffer, const Layout& l, int64_t rows, int64_t cols, LibraryGemm::Operand* o) {
    if (l.strides.size() != r) return false;
    o->word = place(buffer).word + l.offset;
    o->batch_stride = bdim < 0 ? 0 : l.strides[static_cast<size_t>(bdim)];
    int64_t sr = l.strides[r - 2], sc = l.strides[r - 1];
    if (cols == 1) sc = 1;
    if (rows == 1) sr = sc == 1 ? cols : 1;
    if (sc == 1 && sr >= cols) {
      o->row_stride = sr;
      o->col_stride = 1;
      return true;
    }
    if (sr == 1 && sc >= rows) {
      o->row_stride = 1;
      o->col_stride = sc;
      return true;
    }
    return false;
  };
  if (!operand(A.buffer, A.layout, g.m, g.k, &g.a) || !operand(B.buffer, B.layout, g.k, g.n, &g.b) ||
      !operand(lk.outputs[0], lk.out_layouts[0], g.m, g.n, &g.c) || g.c.col_stride != 1) {
    return std::nullopt;
  }
  if (g.batch > 1 && (g.a.batch_stride < 0 || g.b.batch_stride < 0 || g.c.batch_stride < g.m * g.c.row_stride)) return std::nullopt;
  if (g.a.word < 0 || g.b.word < 0 || g.c.word < 0) return std::nullopt;
  return g;
}

void t_product_epilogue(KB& kb, const chroma::Kernel& lk) {
  if (lk.epilogue() < 0) return;  // an empty body: no dispatch
  Expr result;
  result.kind = Expr::kLoad;
  result.dtype = DType::kF32;
  result.buffer = lk.outputs[0];
  result.layout = lk.out_layouts[0];
  kb.per_element(numel(lk.shape), [&](Block& b, const Ex& i) {
    const std::vector<Ex> c = KB::coords_of(b, i, lk.shape);
    kb.store_result(b, lk, c, b.let(kb.eval(b, result, c)));
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
  if (!lk.conv().post_ops.empty()) throw Unsupported("convolution post-ops (a CPU lowering choice)");
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
      const Ex pos = b.let((o[dim] * lit_i(st)) - lit_i(pd) + kw[dim] * lit_i(dl));
      if (pd == 0 && (out_space[dim] - 1) * st + (window[dim] - 1) * dl < xs[2 + dim]) {  // never outside
        xc.push_back(pos);
        continue;
      }
      xc.push_back(b.let(min(max(pos, lit_i(0)), lit_i(xs[2 + dim] - 1))));
      const Ex inside = land(ge(pos, lit_i(0)), lt(pos, lit_i(xs[2 + dim])));
      ok = ok ? land(ok, inside) : inside;
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
      const Ex cx = groups == 1 ? kc[0] : b.let(grp * lit_i(cin_g) + kc[0]);
      return input_at(b, mc[0], cx, std::vector<Ex>(mc.begin() + 1, mc.end()), std::vector<Ex>(kc.begin() + 1, kc.end()));
    };
    g.b = [&](Block& b, const Ex& k, const Ex& n) {
      std::vector<Ex> wc = KB::coords_of(b, k, kshape);
      wc.insert(wc.begin(), groups == 1 ? n : b.let(grp * lit_i(cout_g) + n));
      return kb.eval(b, w, wc);
    };
    g.store = [&](Block& b, const Ex& m, const Ex& n, const Ex& acc) {
      std::vector<Ex> oc = KB::coords_of(b, m, mshape);
      oc.insert(oc.begin() + 1, groups == 1 ? n : b.let(grp * lit_i(cout_g) + n));
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
    const Ex co0 = b.let(o[1] * lit_i(cb), "co");
    const Ex g = b.let(co0 / lit_i(cout_g));
    b.array("acc", Ty::kF32, cb);
    for (int64_t c = 0; c < cb; ++c) b.assign_elem("acc", lit_i(c), lit_f(0));
    b.loop("ci", lit_i(0), lit_i(cin_g), lit_i(1), [&](Block& in, const Ex& ci) {
      const Ex cx = in.let(g * lit_i(cin_g) + ci);
      std::function<void(Block&, size_t, std::vector<Ex>)> win = [&](Block& bb, size_t dim, std::vector<Ex> kw) {
        if (dim == d) {
          const Ex xv = input_at(bb, o[0], cx, os, kw);
          for (int64_t c = 0; c < cb; ++c) {
            std::vector<Ex> wc{co0 + lit_i(c), ci};
            wc.insert(wc.end(), kw.begin(), kw.end());
            const Ex ai = lit_i(c);
            bb.assign_elem("acc", ai, load_array(Space::kPrivate, "acc", Ty::kF32, ai) + xv * kb.eval(bb, w, wc));
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
      oc[1] = l.let(co0 + c);
      kb.store_result(l, lk, oc, l.let(load_array(Space::kPrivate, "acc", Ty::kF32, c)));
    };
    if (cb == 1) store(b, lit_i(0));
    else b.loop("c", lit_i(0), lit_i(cb), lit_i(1), store);
  });
}

}  // namespace chroma::gpu::internal

// The kernel builder the GPU templates share (templates.h, products.cpp): one dispatch
// under construction, with the fused-expression evaluator, stores through the output layouts
// (packed types included), the status block, index helpers and workgroup trees. Internal to
// src/codegen/gpu.
#pragma once

#include <optional>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "codegen/gpu/elementwise.h"
#include "codegen/gpu/gpu_codegen.h"

namespace chroma::gpu::internal {

inline int64_t pow2_at_least(int64_t n, int64_t lo, int64_t hi) {
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
  bool split_k = true;  // Capabilities::split_k
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
      a = a + (strides[d] == 1 ? coords[d] : coords[d] * lit_i(strides[d]));
    }
    return a;
  }

  static Ex from_word(DType t, const Ex& w) {
    switch (compute_type(t)) {
      case Ty::kF32: return bitcast(Ty::kF32, w);
      case Ty::kBool: return ne(w, lit_u(0));
      default: return bitcast(Ty::kI32, w);
    }
  }
  // The stored bits of a value of dtype t (half types: their 16 bits, rounded).
  static Ex to_word(Block& b, DType t, const Ex& v) {
    if (is_half(t)) return half_bits(b, t, v);
    if (v->ty == Ty::kBool) return convert(Ty::kU32, v);
    return bitcast(Ty::kU32, v);
  }

  // 32-bit words of one group of a grouped weight's row: the header, then 64 values of `bits`.
  static int64_t quant_group_words(int bits) { return (4 + quant::kGroup * bits / 8) / 4; }
  // The float16 scale (low half) and bias (high half) of the group whose header is word `gw`
  // of slot `s`, as float32.
  static std::pair<Ex, Ex> group_header(Block& b, int s, const Ex& gw) {
    const Ex hdr = b.let(load_word(s, gw), "hdr");
    return {b.let(half_value(b, DType::kF16, hdr & lit_u(0xffffu))),
            b.let(half_value(b, DType::kF16, hdr >> lit_u(16u)))};
  }

  // A grouped weight (Expr::quant; quant::pack_rows rows, docs/quantization.md) at `coords`:
  // row and k from the layout over the dense [rows, K] tensor; the group's header word holds
  // the float16 scale (low half) and bias; the value's bits lie little-endian from the next
  // word on (a 6-bit value may straddle two words). Returns scale * q + bias in float32.
  Ex dequantize(Block& b, const Expr& e, const std::vector<Ex>& coords) {
    const int bits = quant::format_bits(e.quant);
    const int64_t K = e.quant_k, group_words = quant_group_words(bits), row_words = K / quant::kGroup * group_words;
    // (no structured binding: clang 14 cannot capture one in the lambda below)
    const std::pair<int, Ex> sb = base(&e, e.buffer, 0, false);  // a uint8 buffer: counted in bytes
    const int s = sb.first;
    const Ex byte_base = sb.second;
    const Ex lin = b.let(address(lit_i(0), e.layout.strides, coords));
    const Ex row = b.let(lin / lit_i(K)), kk = b.let(lin % lit_i(K));
    const Ex gw = b.let((byte_base >> lit_i(2)) + row * lit_i(row_words) + (kk >> lit_i(6)) * lit_i(group_words), "gw");
    const std::pair<Ex, Ex> header = group_header(b, s, gw);
    const Ex scale = header.first, bias = header.second;
    const Ex bit = b.let((kk & lit_i(63)) * lit_i(bits));
    const Ex w = b.let(gw + lit_i(1) + (bit >> lit_i(5)));
    const Ex sh = b.let(convert(Ty::kU32, bit & lit_i(31)));
    Ex q = b.let(load_word(s, w) >> sh);
    if (bits == 6) {
      // the bits past the word's end: from the next word (never read past a group: a value
      // straddles only when it is not the group's last)
      const Ex hi = b.mut(Ty::kU32, lit_u(0), "hi");
      b.if_(gt(sh, lit_u(26u)), [&](Block& in) { in.assign(hi, load_word(s, w + lit_i(1)) << (lit_u(32u) - sh)); });
      q = b.let(q | hi);
    }
    const Ex qv = b.let(convert(Ty::kF32, q & lit_u((1u << bits) - 1u)));
    return b.let(scale * qv + bias);
  }

  // The value of a fused expression at `coords` (one coordinate per dimension of its shape),
  // in its compute type.
  Ex eval(Block& b, const Expr& e, const std::vector<Ex>& coords) {
    switch (e.kind) {
      case Expr::kLoad: {
        if (e.buffer == result_buffer_ && result_) return result_;
        if (auto it = resident_.find(e.buffer); it != resident_.end()) return it->second;
        if (auto it = recomputed_.find(e.buffer); it != recomputed_.end()) {
          // the value stored: the expression's, rounded to the buffer's type if a half type
          const Ex v = eval(b, *it->second, coords);
          return is_half(e.dtype) ? b.let(half_value(b, e.dtype, half_bits(b, e.dtype, v))) : v;
        }
        if (e.quant != quant::Format::kF32) return dequantize(b, e, coords);
        auto [s, base_ex] = base(&e, e.buffer, e.layout.offset, false);
        const Ex a = address(base_ex, e.layout.strides, coords);
        const int eb = device_element_bytes(e.dtype);
        if (eb == 4) return from_word(e.dtype, load_word(s, a));
        const auto [word, shift] = packed_position(b, a, eb);
        return b.let(from_bits(b, e.dtype, load_word(s, word) >> shift));
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
            v = v + convert(Ty::kF32, coords[d]) * lit_f(e.affine.strides[d]);
          }
          return b.let(v);
        }
        const int64_t base_v = (e.iota_base.is_int ? e.iota_base.i : static_cast<int64_t>(e.iota_base.f)) +
                               static_cast<int64_t>(e.affine.offset);
        std::vector<int64_t> st;
        for (double c : e.affine.strides) st.push_back(static_cast<int64_t>(c));
        if (e.dtype == DType::kI64) {  // every value of the sequence must fit the i32 it is computed in
          double lo = static_cast<double>(base_v), hi = lo;
          for (size_t d = 0; d < st.size() && d < e.affine.shape.size(); ++d) {
            const double span = static_cast<double>(st[d]) * static_cast<double>(e.affine.shape[d] - 1);
            (span < 0 ? lo : hi) += span;
          }
          if (lo < INT32_MIN || hi > INT32_MAX) {
            throw Unsupported("the int64 sequence " + std::to_string(static_cast<int64_t>(lo)) + " .. " +
                              std::to_string(static_cast<int64_t>(hi)) + " does not fit in 32 bits (GPU integers are narrowed to i32)");
          }
        }
        Ex v = address(lit_i(base_v), st, coords);
        return t == Ty::kBool ? ne(v, lit_i(0)) : b.let(wrap_to(e.dtype, v));
      }
      case Expr::kCast: {
        const Expr& c = e.children[0];
        return b.let(cast_value(b, eval(b, c, coords), c.dtype, e.dtype));
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
      b.store(s, a, to_word(b, t, v));
      return;
    }
    // A packed element: replace its bits of the word (atomically: neighbours may be written
    // by other invocations at the same time).
    const auto [word, shift] = packed_position(b, a, eb);
    const Ex ones = lit_u(eb == 1 ? 0xffu : 0xffffu);
    b.store_bits(s, word, b.let((to_word(b, t, v) & ones) << shift), b.let(ones << shift));
    k.slots[static_cast<size_t>(s)].atomic = true;
  }

  // The word holding the packed element at `a` (counted in elements of `eb` bytes) and the
  // element's bit offset in it.
  static std::pair<Ex, Ex> packed_position(Block& b, const Ex& a, int eb) {
    const Ex at = b.let(a);
    const int per_word = 4 / eb;
    const Ex word = b.let(at >> lit_i(per_word == 4 ? 2 : 1));
    const Ex shift = b.let((at & lit_i(per_word - 1)) << lit_i(eb == 1 ? 3 : 4));
    return {word, shift};
  }

  // A packed element's value from its bits at the bottom of a word (higher bits: neighbours).
  static Ex from_bits(Block& b, DType t, const Ex& w) {
    switch (t) {
      case DType::kF16:
      case DType::kBF16: return half_value(b, t, w);
      case DType::kBool: return ne(w & lit_u(0xff), lit_u(0));
      case DType::kU8: return bitcast(Ty::kI32, w & lit_u(0xff));
      case DType::kI8: return bitcast(Ty::kI32, w << lit_i(24)) >> lit_i(24);  // sign-extended
      case DType::kI16: return bitcast(Ty::kI32, w << lit_i(16)) >> lit_i(16);
      default: throw Unsupported("internal: a packed load of a 32-bit type");
    }
  }

  // Stores a product's result `acc` at `coords` of its output, through the kernel's
  // epilogue when it has one (its loads of the output buffer stand for `acc`).
  void store_result(Block& b, const chroma::Kernel& lk, const std::vector<Ex>& coords, const Ex& acc) {
    Ex v = acc;
    if (lk.epilogue() >= 0) {
      result_buffer_ = lk.outputs[0];
      result_ = acc;
      v = eval(b, lk.inputs[static_cast<size_t>(lk.epilogue())], coords);
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
    b.if_(land(bad, eq(load_word(s, lit_i(0)), lit_u(0))), [&](Block& t) {
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
      Ex q = suffix == 1 ? linear : linear / lit_i(suffix);
      c[d] = b.let(d == outer ? q : q % lit_i(shape[d]), "c");
      suffix *= shape[d];
    }
    return c;
  }

  // Stores elements [0, n) of a packed output that lie contiguously from `l.offset` (row-major in
  // its layout) with each invocation owning whole words (docs/gpu_generator.md, "Layers",
  // A and C): invocation w computes the elements of word w, `value_at(block, linear index)`
  // each, and writes the word once; a word the output shares with other data (its first and last)
  // keeps those bits with a plain read-modify-write, which no other invocation of the dispatch
  // touches. No atomics.
  template <class F> void per_owned_word(const void* site, int32_t buf, const Layout& l, int64_t n, F value_at) {
    const DType t = buffer(buf).type.dtype;
    const int eb = device_element_bytes(t), per = 4 / eb;
    const int64_t first = place_(buf).word * per + l.offset;  // in elements from the slot's start
    const int64_t lead = first % per;                         // elements of the first word before ours
    const std::pair<int, Ex> sb = base(site, buf, l.offset, true);  // (no structured binding: a lambda captures them)
    const int s = sb.first;
    const Ex base_ex = sb.second;
    const Ex ones = lit_u(eb == 1 ? 0xffu : 0xffffu);
    per_element((lead + n + per - 1) / per, [&](Block& b, const Ex& w) {
      const Ex word = b.mut(Ty::kU32, lit_u(0), "word");
      const Ex keep = b.mut(Ty::kU32, lit_u(0), "keep");  // bits of the word this kernel does not write
      b.loop("j", lit_i(0), lit_i(per), lit_i(1), [&](Block& lb, const Ex& j) {
        const Ex e = lb.let((w * lit_i(per) + j) - lit_i(lead), "e");
        const Ex shift = lb.let(j * lit_i(8 * eb));
        lb.if_else(land(ge(e, lit_i(0)), lt(e, lit_i(n))),
                   [&](Block& in) {
                     const Ex v = in.let(to_word(in, t, value_at(in, e)) & ones);
                     in.assign(word, word | (v << shift));
                   },
                   [&](Block& in) { in.assign(keep, keep | (ones << shift)); });
      });
      const Ex at = b.let((base_ex >> lit_i(per == 4 ? 2 : 1)) + w, "w");
      if (lead == 0 && n % per == 0) {
        b.store(s, at, word);
        return;
      }
      b.if_else(eq(keep, lit_u(0)), [&](Block& in) { in.store(s, at, word); },
                [&](Block& in) { in.store(s, at, (load_word(s, at) & keep) | word); });
    });
  }

  // The invocation's linear index over `total` elements, `wg * W + lid`; the body runs when it
  // is in range.
  template <class F> void per_element(int64_t total, F body_fn) {
    if (total >= (1ll << 31)) throw Unsupported("more than 2^31 elements in one kernel");
    k.workgroups = std::max<int64_t>(1, (total + k.workgroup_size - 1) / k.workgroup_size);
    Block b = body();
    const Ex i = b.let(var("wg", Ty::kI32) * lit_i(k.workgroup_size) + var("lid", Ty::kI32), "i");
    b.if_(lt(i, lit_i(total)), [&](Block& in) { body_fn(in, i); });
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
      b.if_(eq(sg_lane, lit_i(0)),
            [&](Block& t) { t.shared_store(name, var("lid", Ty::kI32) / sg_size, r); });
      b.barrier();
      const Ex acc = b.mut(v->ty, init, "r");
      // a subgroup is taken to be the invocations lid / sg_size (consecutive local indices,
      // as Vulkan, D3D12 and Metal lay out one-dimensional workgroups; WGSL does not say),
      // and may be wider than the workgroup: ceil(W / sg_size) partials
      b.loop("g", lit_i(0), lit_i(w - 1) / sg_size + lit_i(1), lit_i(1), [&](Block& l, const Ex& g) {
        l.assign(acc, combine(l, acc, l.let(load_array(Space::kShared, name, v->ty, g))));
      });
      b.barrier();  // the array may be reused after this
      return acc;
    }
    add_shared(name, v->ty, w);
    b.shared_store(name, var("lid", Ty::kI32), v);
    b.barrier();
    for (int s = w / 2; s > 0; s /= 2) {
      b.if_(lt(var("lid", Ty::kI32), lit_i(s)), [&](Block& t) {
        const Ex x = t.let(load_array(Space::kShared, name, v->ty, var("lid", Ty::kI32)));
        const Ex y = t.let(load_array(Space::kShared, name, v->ty, var("lid", Ty::kI32) + lit_i(s)));
        t.shared_store(name, var("lid", Ty::kI32), combine(t, x, y));
      });
      b.barrier();
    }
    const Ex r = b.let(load_array(Space::kShared, name, v->ty, lit_i(0)), "r");
    b.barrier();  // the array may be reused after this
    return r;
  }

  // Inclusive scan of every invocation's `v` over the workgroup (Hillis-Steele through the
  // shared array `name`, log2 W steps): in invocation i, combine(earlier, later) over the
  // invocations 0..i in order; `name` then holds every invocation's result.
  Ex inclusive_scan(Block& b, const Ex& v, const std::string& name, const std::function<Ex(Block&, Ex, Ex)>& combine) {
    const int w = k.workgroup_size;
    const Ex lid = var("lid", Ty::kI32);
    const Ex x = b.mut(v->ty, v, "scan");
    add_shared(name, v->ty, w);
    b.shared_store(name, lid, x);
    b.barrier();
    for (int s = 1; s < w; s *= 2) {
      b.if_(ge(lid, lit_i(s)), [&](Block& t) {
        t.assign(x, combine(t, t.let(load_array(Space::kShared, name, v->ty, lid - lit_i(s))), x));
      });
      b.barrier();
      b.shared_store(name, lid, x);
      b.barrier();
    }
    return x;
  }

  // A buffer whose element for this invocation's row is held in a register (t_row_group): its
  // loads read `v` (the caller has checked that each such load reads that element).
  void set_resident(int32_t buffer, Ex v) { resident_[buffer] = std::move(v); }
  // A buffer an earlier phase of this kernel computed (t_row_group: a half type, or not stored):
  // its loads (each at the element being computed, as the caller has checked) evaluate `e`
  // there again, rounded to the buffer's type.
  void set_recomputed(int32_t buffer, const Expr* e) { recomputed_[buffer] = e; }

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
  std::map<int32_t, Ex> resident_;
  std::map<int32_t, const Expr*> recomputed_;
};

// Matrix products and convolutions (products.cpp).
void t_matmul(KB& kb, const chroma::Kernel& lk);
// The product `lk` as a library gemm when its operands allow it (float32, strided matrices,
// more than 8 rows and columns), else nothing.
std::optional<LibraryGemm> library_gemm_call(const Program& p, const std::function<Placement(int32_t)>& place,
                                             const chroma::Kernel& lk);
// The elementwise epilogue of a product the library computed: reads each result back from
// the output and stores the epilogue's value over it (nothing to do without an epilogue).
void t_product_epilogue(KB& kb, const chroma::Kernel& lk);
void t_conv(KB& kb, const chroma::Kernel& lk);

}  // namespace chroma::gpu::internal

// Kernel templates (docs/gpu_generator.md, "Layers", B): one per lowered kernel
// kind, written once over the kernel IR (templates.h lists them: reductions in reductions.cpp,
// gathers and scatters in indexing.cpp, products and convolutions in products.cpp). Here:
// assignments, concatenations and generate(), which picks each kernel's template, prints its
// dispatches and gathers each distinct text into one module.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "codegen/gpu/templates.h"

namespace chroma::gpu {

namespace internal {

namespace {

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

}  // namespace

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
        const Ex local = in.let(start ? i - lit_i(start) : i);
        const std::vector<Ex> c = KB::coords_of(in, local, lk.out_layouts[p].shape);
        kb.store(in, &lk.out_layouts[p], lk.outputs[p], lk.out_layouts[p], c, kb.eval(in, lk.inputs[p], c));
      };
      if (p + 1 == lk.inputs.size()) return body(bb);
      bb.if_else(lt(i, lit_i(ends[p])), body, [&](Block& rest) { part(rest, p + 1); });
    };
    part(b, 0);
  });
}

}  // namespace internal

using internal::KB;
using internal::row_group;
using internal::t_arg_reduce;
using internal::t_assign;
using internal::t_concat;
using internal::t_gather;
using internal::t_index_put;
using internal::t_reduce;
using internal::t_row_group;
using internal::t_scan;
using internal::t_softmax;
using internal::t_topk;

namespace {

// The dispatches of lowered kernel `lk`, or of the row group `group` it starts, as the
// templates build them, with or without subgroup operations; with `library_gemm` the library
// computes the product and only its epilogue is generated. The parts are dispatches
// first_dispatch, first_dispatch + 1, ...
std::vector<KB> build_parts(const Program& p, const std::function<Placement(int32_t)>& place, const Capabilities& caps,
                            const chroma::Kernel& lk, const std::vector<size_t>& group, bool library_gemm,
                            int first_dispatch, bool subgroups) {
  std::vector<KB> parts;
  auto make = [&](const char* what) -> KB& {
    parts.emplace_back(p, place, std::string(chroma::kernel_kind(lk.kind)) + what, 256,
                       first_dispatch + static_cast<int>(parts.size()), subgroups);
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
      if (library_gemm) internal::t_product_epilogue(make("_epilogue"), lk);
      else internal::t_matmul(make(""), lk);
      break;
    case chroma::Kernel::kGather:
    case chroma::Kernel::kGatherElements: t_gather(make(""), lk); break;
    case chroma::Kernel::kTopK: t_topk(make(""), lk); break;
    case chroma::Kernel::kScan: t_scan(make(""), lk, p); break;
    case chroma::Kernel::kConv: internal::t_conv(make(""), lk); break;
    case chroma::Kernel::kAttention: internal::t_attention(make(""), lk, caps.max_shared_bytes); break;
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
      throw Unsupported("internal: a CPU-only kernel kind reached the GPU generator");
  }
  return parts;
}

// Legalizes and prints each part of lowered kernel `ki` (with its subgroup variant, when
// `sg_parts` has one with the same params and bindings) as a dispatch of `out`, each distinct
// text once among out.modules (`module_of`: text -> module).
void add_dispatches(Generated& out, std::map<std::string, int>& module_of, std::vector<KB>& parts,
                    std::vector<KB>& sg_parts, const Capabilities& caps, const Dialect& d, const chroma::Kernel& lk,
                    size_t ki, const std::string& label) {
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
      m.name = "k";  // (appended: GCC 12's -Wrestrict misreads "k" + std::string at -O3)
      m.name += std::to_string(out.modules.size()) + "_" + kb.k.name;
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
        return build_parts(p, place, caps, lk, group, gemm.has_value(), static_cast<int>(out.dispatches.size()),
                           subgroups);
      };
      std::vector<KB> parts = build(caps.subgroup_size > 0);
      // A second text with subgroup operations for the runtimes to pick (Module::code_subgroups)
      // when the kernel has a use for them; the same params and bindings, or none.
      std::vector<KB> sg_parts;
      if (caps.subgroup_variants && caps.subgroup_size == 0 &&
          (group.size() > 1 || lk.kind == chroma::Kernel::kReduce || lk.kind == chroma::Kernel::kSoftmax)) {
        sg_parts = build(true);
      }
      add_dispatches(out, module_of, parts, sg_parts, caps, d, lk, ki, label);
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

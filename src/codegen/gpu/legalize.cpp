// Legalization (docs/gpu_generator.md, "Layers", C): rewrites and checks a
// kernel against the device's capability record before it is printed. Never a test of which
// dialect prints.
#include <set>
#include <string>

#include "codegen/gpu/elementwise.h"
#include "codegen/gpu/gpu_codegen.h"

namespace chroma::gpu {

namespace {

// Does the expression read an invocation-varying value (lid, a non-uniform variable, or
// memory: WGSL's uniformity analysis treats read-write storage and workgroup loads as
// non-uniform)?
bool varies(const Ex& e, const std::set<std::string>& nonuniform) {
  if (!e) return false;
  if (e->kind == Node::kVar) return e->op == "lid" || e->op == "sg_lane" || nonuniform.count(e->op) > 0;
  if (e->kind == Node::kLoad) return true;
  for (const Ex& a : e->args) {
    if (varies(a, nonuniform)) return true;
  }
  return false;
}

// Marks the variables whose values vary across a workgroup's invocations.
void mark(const std::vector<Stmt>& ss, bool divergent, std::set<std::string>* nu, bool* changed) {
  for (const Stmt& s : ss) {
    auto set = [&](const std::string& n) {
      if (nu->insert(n).second) *changed = true;
    };
    switch (s.kind) {
      case Stmt::kLet:
      case Stmt::kVar:
      case Stmt::kAssign:
        if (divergent || varies(s.value, *nu) || (s.index && varies(s.index, *nu))) set(s.name);
        break;
      case Stmt::kFor: {
        const bool d = divergent || varies(s.begin, *nu) || varies(s.end, *nu) || varies(s.step, *nu);
        if (d) set(s.name);
        mark(s.body, d, nu, changed);
        break;
      }
      case Stmt::kIf: {
        const bool d = divergent || varies(s.cond, *nu);
        mark(s.body, d, nu, changed);
        mark(s.orelse, d, nu, changed);
        break;
      }
      default: break;
    }
  }
}

void check_barriers(const std::vector<Stmt>& ss, bool divergent, const std::set<std::string>& nu, const std::string& name) {
  for (const Stmt& s : ss) {
    if (s.kind == Stmt::kBarrier && divergent) {
      throw Unsupported("internal: kernel '" + name + "' has a barrier in non-uniform control flow");
    }
    if (s.kind == Stmt::kFor) {
      check_barriers(s.body, divergent || varies(s.begin, nu) || varies(s.end, nu) || varies(s.step, nu), nu, name);
    }
    if (s.kind == Stmt::kIf) {
      const bool d = divergent || varies(s.cond, nu);
      check_barriers(s.body, d, nu, name);
      check_barriers(s.orelse, d, nu, name);
    }
    if ((s.kind == Stmt::kReturn || s.kind == Stmt::kBreak) && divergent) {
      // a divergent exit before a later barrier would also be non-uniform; the templates
      // only exit uniformly, so any divergent exit is refused outright
      throw Unsupported("internal: kernel '" + name + "' exits in non-uniform control flow");
    }
  }
}

}  // namespace

void legalize(Kernel& k, const Capabilities& caps) {
  if (k.workgroup_size > caps.max_workgroup_size) {
    throw Unsupported("kernel '" + k.name + "' needs workgroups of " + std::to_string(k.workgroup_size) +
                      " invocations; the device allows " + std::to_string(caps.max_workgroup_size));
  }
  int64_t shared = 0;
  for (const SharedArray& a : k.shared) shared += 4 * a.count;
  if (shared > caps.max_shared_bytes) {
    throw Unsupported("kernel '" + k.name + "' needs " + std::to_string(shared) + " bytes of workgroup memory; the device allows " +
                      std::to_string(caps.max_shared_bytes));
  }
  if (static_cast<int>(k.slots.size()) > caps.max_storage_buffers) {
    throw Unsupported("kernel '" + k.name + "' reads " + std::to_string(k.slots.size()) +
                      " storage buffers; the device allows " + std::to_string(caps.max_storage_buffers) + " per stage");
  }
  // Grid folding: a linear workgroup count above the per-dimension limit becomes a 2-D grid
  // (the printer's prologue recombines wg = x + y * grid_x) and surplus workgroups return.
  k.grid_x = std::min(k.workgroups, caps.max_grid);
  k.grid_y = (k.workgroups + k.grid_x - 1) / k.grid_x;
  if (k.grid_y > caps.max_grid) {
    throw Unsupported("kernel '" + k.name + "' needs " + std::to_string(k.workgroups) + " workgroups, more than " +
                      std::to_string(caps.max_grid) + "^2");
  }
  if (k.grid_x * k.grid_y != k.workgroups) {
    Stmt guard;
    guard.kind = Stmt::kIf;
    guard.cond = ge(var("wg", Ty::kI32), lit_i(k.workgroups));
    Stmt r;
    r.kind = Stmt::kReturn;
    guard.body.push_back(r);
    k.body.insert(k.body.begin(), guard);
  }
  std::set<std::string> nu;
  bool changed = true;
  while (changed) {
    changed = false;
    mark(k.body, false, &nu, &changed);
  }
  check_barriers(k.body, false, nu, k.name);
}

}  // namespace chroma::gpu

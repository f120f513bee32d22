#include "codegen/gpu/printer.h"

#include "codegen/gpu/elementwise.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace chroma::gpu {

namespace {

using Subst = std::vector<std::pair<std::string, std::string>>;

// Replaces every {key} of the pattern by its value; other braces are kept as they are.
std::string fmt(const std::string& pattern, const Subst& subst) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '{') {
      const size_t close = pattern.find('}', i);
      if (close != std::string::npos) {
        const std::string key = pattern.substr(i + 1, close - i - 1);
        bool found = false;
        for (const auto& [k, v] : subst) {
          if (k == key) {
            out += v;
            found = true;
            break;
          }
        }
        if (found) {
          i = close;
          continue;
        }
      }
    }
    out += pattern[i];
  }
  return out;
}

class Printer {
 public:
  Printer(const Kernel& k, const Dialect& d) : k_(k), d_(d) {}

  std::string type(Ty t) const { return d_.types[static_cast<int>(t)]; }
  bool atomic(int slot) const { return k_.slots[static_cast<size_t>(slot)].atomic; }

  std::string float_lit(double v) const {
    const float f = static_cast<float>(v);
    if (!std::isfinite(f)) {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      return fmt(d_.nonfinite_float, {{"0", fmt(d_.uint_lit, {{"0", std::to_string(bits)}})}});
    }
    char buf[64];
    for (int prec = 6; prec <= 9; ++prec) {  // the shortest decimal that reads back as f
      std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(f));
      if (std::strtof(buf, nullptr) == f) break;
    }
    std::string s = buf;
    if (s.find_first_of(".en") == std::string::npos) s += ".0";
    return fmt(d_.float_lit, {{"0", s}});
  }

  std::string int_lit(int64_t v) const {
    if (v == INT32_MIN) {
      return fmt(d_.bitcast, {{"type", type(Ty::kI32)}, {"0", fmt(d_.uint_lit, {{"0", "2147483648"}})}});
    }
    if (v < 0) return "(-" + fmt(d_.int_lit, {{"0", std::to_string(-v)}}) + ")";
    return fmt(d_.int_lit, {{"0", std::to_string(v)}});
  }

  std::string expr(const Ex& e) const {
    switch (e->kind) {
      case Node::kVar: return e->op;
      case Node::kLit:
        switch (e->ty) {
          case Ty::kF32: return float_lit(e->f);
          case Ty::kI32: return int_lit(e->i);
          case Ty::kU32: return fmt(d_.uint_lit, {{"0", std::to_string(static_cast<uint32_t>(e->i))}});
          case Ty::kBool: return e->i ? "true" : "false";
        }
        break;
      case Node::kUnary: {
        // (built by appending: GCC 12's -Wrestrict misreads "(" + std::string at -O3)
        std::string out = "(";
        out += spelling(e->un_op);
        out += expr(e->args[0]);
        out += ")";
        return out;
      }
      case Node::kBinary: {
        std::string rhs = expr(e->args[1]);
        if (e->bin_op == BinOp::kShl || e->bin_op == BinOp::kShr) rhs = fmt(d_.shift_amount, {{"0", rhs}});
        if (e->bin_op == BinOp::kRem && e->ty == Ty::kF32 && !d_.float_remainder.empty()) {
          return fmt(d_.float_remainder, {{"0", expr(e->args[0])}, {"1", rhs}});
        }
        std::string out = "(";
        out += expr(e->args[0]);
        out += " ";
        out += spelling(e->bin_op);
        out += " ";
        out += rhs;
        out += ")";
        return out;
      }
      case Node::kCall: {
        Subst s{{"type", type(e->ty)}};
        std::string plain = e->op + "(";
        for (size_t i = 0; i < e->args.size(); ++i) {
          const std::string a = expr(e->args[i]);
          s.emplace_back(std::to_string(i), a);
          plain += (i ? ", " : "") + a;
        }
        auto it = d_.builtins.find(e->op);
        return it == d_.builtins.end() ? plain + ")" : fmt(it->second, s);
      }
      case Node::kLoad:
        if (e->space == Space::kGlobal) {
          return fmt(atomic(e->slot) && !d_.load_global_atomic.empty() ? d_.load_global_atomic : d_.load_global,
                     {{"slot", std::to_string(e->slot)}, {"0", expr(e->args[0])}});
        }
        return e->op + "[" + expr(e->args[0]) + "]";
      case Node::kConvert: return fmt(d_.convert, {{"type", type(e->ty)}, {"0", expr(e->args[0])}});
      case Node::kBitcast: return fmt(d_.bitcast, {{"type", type(e->ty)}, {"0", expr(e->args[0])}});
      case Node::kParam: return fmt(d_.param, {{"0", std::to_string(e->slot)}});
    }
    throw std::logic_error("gpu printer: unknown expression kind");
  }

  void stmts(const std::vector<Stmt>& ss, int depth) {
    for (const Stmt& s : ss) stmt(s, depth);
  }

  void line(int depth, const std::string& text) { o_ << std::string(static_cast<size_t>(2 * depth), ' ') << text << "\n"; }

  void stmt(const Stmt& s, int depth) {
    switch (s.kind) {
      case Stmt::kLet:
        line(depth, fmt(d_.let, {{"name", s.name}, {"type", type(s.ty)}, {"value", expr(s.value)}}));
        break;
      case Stmt::kVar:
        if (s.value) line(depth, fmt(d_.var, {{"name", s.name}, {"type", type(s.ty)}, {"value", expr(s.value)}}));
        else line(depth, fmt(d_.var_zero, {{"name", s.name}, {"type", type(s.ty)}}));
        break;
      case Stmt::kArray:
        line(depth, fmt(d_.array, {{"name", s.name}, {"type", type(s.ty)}, {"count", std::to_string(s.count)}}));
        break;
      case Stmt::kAssign:
        if (s.index) line(depth, fmt(d_.assign_elem, {{"name", s.name}, {"index", expr(s.index)}, {"value", expr(s.value)}}));
        else line(depth, fmt(d_.assign, {{"name", s.name}, {"value", expr(s.value)}}));
        break;
      case Stmt::kStore:
        line(depth, fmt(atomic(s.slot) && !d_.store_global_atomic.empty() ? d_.store_global_atomic : d_.store_global,
                        {{"slot", std::to_string(s.slot)}, {"0", expr(s.index)}, {"1", expr(s.value)}}));
        break;
      case Stmt::kStoreBits:
        if (!atomic(s.slot)) throw std::logic_error("gpu printer: a bit-field store to a slot not marked atomic");
        line(depth, fmt(d_.store_bits, {{"slot", std::to_string(s.slot)}, {"0", expr(s.index)}, {"1", expr(s.value)},
                                        {"mask", expr(s.mask)}}));
        break;
      case Stmt::kSharedStore:
        line(depth, fmt(d_.assign_elem, {{"name", s.name}, {"index", expr(s.index)}, {"value", expr(s.value)}}));
        break;
      case Stmt::kFor:
        line(depth, fmt(d_.for_open, {{"name", s.name}, {"begin", expr(s.begin)}, {"end", expr(s.end)}, {"step", expr(s.step)}}));
        stmts(s.body, depth + 1);
        line(depth, d_.close);
        break;
      case Stmt::kIf:
        line(depth, fmt(d_.if_open, {{"cond", expr(s.cond)}}));
        stmts(s.body, depth + 1);
        if (!s.orelse.empty()) {
          line(depth, d_.else_open);
          stmts(s.orelse, depth + 1);
        }
        line(depth, d_.close);
        break;
      case Stmt::kBarrier: line(depth, d_.barrier); break;
      case Stmt::kBreak: line(depth, d_.brk); break;
      case Stmt::kReturn: line(depth, d_.ret); break;
    }
  }

  std::string module() {
    const std::string wgsize = std::to_string(k_.workgroup_size);
    if (k_.subgroups && d_.subgroup_prologue.empty()) throw Unsupported("the " + d_.name + " dialect has no subgroup operations");
    o_ << "// " << k_.name << ": " << k_.workgroups << " workgroups of " << wgsize << "\n"
       << (k_.subgroups ? d_.subgroup_enable : "") << d_.prelude;
    // Params and bindings.
    std::string args;
    int binding = 0;
    auto add_arg = [&](const std::string& a) {
      if (a.empty()) return;
      if (!d_.arg_separator.empty()) {
        args += (args.empty() ? "" : d_.arg_separator) + a;
      } else {
        o_ << a << "\n";
      }
    };
    for (size_t i = 0; i < k_.slots.size(); ++i) {
      const std::string& pat = atomic(static_cast<int>(i)) && !d_.binding_atomic.empty() ? d_.binding_atomic
                               : k_.slots[i].writable                                      ? d_.binding_rw
                                                                                           : d_.binding_ro;
      add_arg(fmt(pat, {{"binding", std::to_string(binding + static_cast<int>(i) + (k_.params ? 1 : 0))}, {"slot", std::to_string(i)}}));
    }
    if (k_.params && d_.params_struct_open.empty()) {  // params as kernel arguments
      for (int i = 0; i < k_.params; ++i) add_arg(fmt(d_.params_field, {{"0", std::to_string(i)}}));
    } else if (k_.params) {
      std::string fields;
      for (int i = 0; i < k_.params; ++i) fields += fmt(d_.params_field, {{"0", std::to_string(i)}});
      o_ << d_.params_struct_open << fields << d_.params_struct_close;
      add_arg(fmt(d_.binding_params, {{"binding", std::to_string(binding)}}));
    }
    std::string shared;
    for (const SharedArray& a : k_.shared) {
      shared += fmt(d_.shared_decl, {{"name", a.name}, {"type", type(a.ty)}, {"count", std::to_string(a.count)}}) + "\n";
    }
    if (!d_.shared_in_body) o_ << shared;
    o_ << fmt(d_.kernel_open, {{"name", "main"}, {"wgsize", wgsize}, {"args", args}, {"extra", k_.subgroups ? d_.subgroup_args : ""}})
       << "\n";
    if (d_.shared_in_body && !shared.empty()) o_ << "  " << shared;
    o_ << fmt(d_.prologue, {{"grid_x", std::to_string(k_.grid_x)}}) << (k_.subgroups ? d_.subgroup_prologue : "");
    stmts(k_.body, 1);
    o_ << d_.close << "\n";
    return o_.str();
  }

 private:
  const Kernel& k_;
  const Dialect& d_;
  std::ostringstream o_;
};

}  // namespace

std::string print_kernel(const Kernel& k, const Dialect& d) { return Printer(k, d).module(); }

}  // namespace chroma::gpu

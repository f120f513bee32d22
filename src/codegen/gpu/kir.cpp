#include "codegen/gpu/kir.h"


namespace chroma::gpu {

namespace {
Ex make(Node n) { return std::make_shared<const Node>(std::move(n)); }
}  // namespace

const char* spelling(UnOp op) {
  switch (op) {
    case UnOp::kNeg: return "-";
    case UnOp::kNot: return "!";
    case UnOp::kBitNot: return "~";
  }
  return "?";
}

const char* spelling(BinOp op) {
  switch (op) {
    case BinOp::kAdd: return "+";
    case BinOp::kSub: return "-";
    case BinOp::kMul: return "*";
    case BinOp::kDiv: return "/";
    case BinOp::kRem: return "%";
    case BinOp::kEq: return "==";
    case BinOp::kNe: return "!=";
    case BinOp::kLt: return "<";
    case BinOp::kLe: return "<=";
    case BinOp::kGt: return ">";
    case BinOp::kGe: return ">=";
    case BinOp::kAnd: return "&&";
    case BinOp::kOr: return "||";
    case BinOp::kBitAnd: return "&";
    case BinOp::kBitOr: return "|";
    case BinOp::kBitXor: return "^";
    case BinOp::kShl: return "<<";
    case BinOp::kShr: return ">>";
  }
  return "?";
}

bool is_comparison(BinOp op) {
  switch (op) {
    case BinOp::kEq:
    case BinOp::kNe:
    case BinOp::kLt:
    case BinOp::kLe:
    case BinOp::kGt:
    case BinOp::kGe:
    case BinOp::kAnd:
    case BinOp::kOr: return true;
    case BinOp::kAdd:
    case BinOp::kSub:
    case BinOp::kMul:
    case BinOp::kDiv:
    case BinOp::kRem:
    case BinOp::kBitAnd:
    case BinOp::kBitOr:
    case BinOp::kBitXor:
    case BinOp::kShl:
    case BinOp::kShr: return false;
  }
  return false;
}

Ex var(const std::string& name, Ty ty) {
  Node n;
  n.kind = Node::kVar;
  n.ty = ty;
  n.op = name;
  return make(std::move(n));
}
Ex lit_f(double v) {
  Node n;
  n.ty = Ty::kF32;
  n.f = v;
  return make(std::move(n));
}
Ex lit_i(int64_t v) {
  Node n;
  n.ty = Ty::kI32;
  n.i = v;
  return make(std::move(n));
}
Ex lit_u(uint64_t v) {
  Node n;
  n.ty = Ty::kU32;
  n.i = static_cast<int64_t>(v);
  return make(std::move(n));
}
Ex lit_b(bool v) {
  Node n;
  n.ty = Ty::kBool;
  n.i = v ? 1 : 0;
  return make(std::move(n));
}
Ex lit(Ty ty, double v) {
  switch (ty) {
    case Ty::kF32: return lit_f(v);
    case Ty::kI32: return lit_i(static_cast<int64_t>(v));
    case Ty::kU32: return lit_u(static_cast<uint64_t>(v));
    case Ty::kBool: return lit_b(v != 0);
  }
  return lit_f(v);
}
Ex param(int index) {
  Node n;
  n.kind = Node::kParam;
  n.ty = Ty::kI32;
  n.slot = index;
  return make(std::move(n));
}
Ex un(UnOp op, Ex a) {
  Node n;
  n.kind = Node::kUnary;
  n.ty = op == UnOp::kNot ? Ty::kBool : a->ty;
  n.un_op = op;
  n.args = {std::move(a)};
  return make(std::move(n));
}
Ex bin(BinOp op, Ex a, Ex b) {
  // integer identities (index arithmetic: strides of 1, offsets of 0)
  if (a->ty == b->ty && a->ty != Ty::kF32 && a->ty != Ty::kBool) {
    if (op == BinOp::kAdd && is_lit(a, 0)) return b;
    if ((op == BinOp::kAdd || op == BinOp::kSub) && is_lit(b, 0)) return a;
    if (op == BinOp::kMul && is_lit(a, 1)) return b;
    if ((op == BinOp::kMul || op == BinOp::kDiv) && is_lit(b, 1)) return a;
    if (op == BinOp::kMul && (is_lit(a, 0) || is_lit(b, 0))) return is_lit(a, 0) ? a : b;
  }
  Node n;
  n.kind = Node::kBinary;
  n.ty = is_comparison(op) ? Ty::kBool : a->ty;
  n.bin_op = op;
  n.args = {std::move(a), std::move(b)};
  return make(std::move(n));
}
Ex call(const char* fn, Ty ty, std::vector<Ex> args) {
  Node n;
  n.kind = Node::kCall;
  n.ty = ty;
  n.op = fn;
  n.args = std::move(args);
  return make(std::move(n));
}
Ex select(Ex if_false, Ex if_true, Ex cond) {
  const Ty t = if_true->ty;
  return call("select", t, {std::move(if_false), std::move(if_true), std::move(cond)});
}
Ex convert(Ty ty, Ex a) {
  if (a->ty == ty) return a;
  Node n;
  n.kind = Node::kConvert;
  n.ty = ty;
  n.args = {std::move(a)};
  return make(std::move(n));
}
Ex bitcast(Ty ty, Ex a) {
  if (a->ty == ty) return a;
  Node n;
  n.kind = Node::kBitcast;
  n.ty = ty;
  n.args = {std::move(a)};
  return make(std::move(n));
}
Ex load_word(int slot, Ex index) {
  Node n;
  n.kind = Node::kLoad;
  n.ty = Ty::kU32;
  n.slot = slot;
  n.space = Space::kGlobal;
  n.args = {std::move(index)};
  return make(std::move(n));
}
Ex load_array(Space space, const std::string& name, Ty ty, Ex index) {
  Node n;
  n.kind = Node::kLoad;
  n.ty = ty;
  n.op = name;
  n.space = space;
  n.args = {std::move(index)};
  return make(std::move(n));
}
bool is_lit(const Ex& e, int64_t v) { return e->kind == Node::kLit && e->ty != Ty::kF32 && e->i == v; }

std::string Block::fresh(const char* hint) {
  std::string name = std::string(hint) + std::to_string((*counter_)++);
  // a hint and a count can spell a type of some dialect (i32, u8, f16, ...)
  for (const char* type : {"i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64"}) {
    if (name == type) name += "_";
  }
  return name;
}

Ex Block::let(Ex e, const char* hint) {
  if (e->kind == Node::kLit || e->kind == Node::kVar || e->kind == Node::kParam) return e;
  Stmt s;
  s.kind = Stmt::kLet;
  s.name = fresh(hint);
  s.ty = e->ty;
  s.value = std::move(e);
  out_->push_back(s);
  return var(s.name, s.ty);
}
Ex Block::mut(Ty ty, Ex init, const char* hint) {
  Stmt s;
  s.kind = Stmt::kVar;
  s.name = fresh(hint);
  s.ty = ty;
  s.value = std::move(init);
  out_->push_back(s);
  return var(s.name, ty);
}
void Block::assign(const Ex& v, Ex value) {
  Stmt s;
  s.kind = Stmt::kAssign;
  s.name = v->op;
  s.value = std::move(value);
  out_->push_back(std::move(s));
}
void Block::array(const std::string& name, Ty ty, int64_t count) {
  Stmt s;
  s.kind = Stmt::kArray;
  s.name = name;
  s.ty = ty;
  s.count = count;
  out_->push_back(std::move(s));
}
void Block::assign_elem(const std::string& name, Ex index, Ex value) {
  Stmt s;
  s.kind = Stmt::kAssign;
  s.name = name;
  s.index = std::move(index);
  s.value = std::move(value);
  out_->push_back(std::move(s));
}
void Block::store(int slot, Ex index, Ex word) {
  Stmt s;
  s.kind = Stmt::kStore;
  s.slot = slot;
  s.index = std::move(index);
  s.value = std::move(word);
  out_->push_back(std::move(s));
}
void Block::store_bits(int slot, Ex index, Ex bits, Ex mask) {
  Stmt s;
  s.kind = Stmt::kStoreBits;
  s.slot = slot;
  s.index = std::move(index);
  s.value = std::move(bits);
  s.mask = std::move(mask);
  out_->push_back(std::move(s));
}
void Block::shared_store(const std::string& name, Ex index, Ex value) {
  Stmt s;
  s.kind = Stmt::kSharedStore;
  s.name = name;
  s.index = std::move(index);
  s.value = std::move(value);
  out_->push_back(std::move(s));
}
void Block::barrier() {
  Stmt s;
  s.kind = Stmt::kBarrier;
  out_->push_back(std::move(s));
}
void Block::brk() {
  Stmt s;
  s.kind = Stmt::kBreak;
  out_->push_back(std::move(s));
}
void Block::ret() {
  Stmt s;
  s.kind = Stmt::kReturn;
  out_->push_back(std::move(s));
}

}  // namespace chroma::gpu

// The GPU kernel IR (docs/gpu_generator.md, "Layers", A): one structured
// representation for every GPU dialect. Kernels are built over it by the templates (templates.h),
// checked and rewritten by the legalization passes (legalize.cpp) and printed by a dialect table
// (printer.cpp). Nothing here knows which dialect will print it.
//
// Conventions every kernel follows:
// - Global memory is a set of *slots*, each an array of 32-bit words (WGSL `array<u32>`,
//   CUDA/MSL `uint*`); a typed load is a word load and a bit cast, so a tensor of any 32-bit
//   type lives anywhere in any slot. Which buffer a slot is (arena, state, a weights shard)
//   is decided per dispatch, so repeated layers share one kernel text.
// - Tensors of 8- and 16-bit types are packed (4 or 2 to a word). A store to one replaces
//   its bits of the word (kStoreBits) with atomic and/or, so invocations writing neighbouring
//   elements of one word never race; a slot with such stores is *atomic* (WGSL declares it
//   `array<atomic<u32>>` and reads it with atomicLoad).
// - Per-dispatch values (buffer offsets in words, the dispatch's own index) are uniform u32
//   *params*; everything else (shapes, strides, literals) is printed into the text.
// - Workgroups are one-dimensional; `lid` is the invocation's index in its workgroup and `wg`
//   the linear workgroup index (the printer derives it from a 2-D grid when legalization
//   folded the grid). Both are predeclared i32 values named "lid" and "wg".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace chroma::gpu {

enum class Ty : uint8_t { kF32, kI32, kU32, kBool };
enum class Space : uint8_t { kGlobal, kShared, kPrivate };

// Kernel-IR operators (Node::kUnary, Node::kBinary). Every dialect spells them as C does
// (spelling()); what a dialect prints differently around one is in its table
// (Dialect::shift_amount, Dialect::float_remainder).
enum class UnOp : uint8_t {
  kNeg,     // -
  kNot,     // !  (bool)
  kBitNot,  // ~
};
enum class BinOp : uint8_t {
  kAdd, kSub, kMul, kDiv, kRem,         // + - * / %  (a's type)
  kEq, kNe, kLt, kLe, kGt, kGe,         // == != < <= > >=  (bool)
  kAnd, kOr,                            // && ||  (bool)
  kBitAnd, kBitOr, kBitXor, kShl, kShr,  // & | ^ << >>  (a's type; a shift amount is i32 or u32)
};
const char* spelling(UnOp op);
const char* spelling(BinOp op);
bool is_comparison(BinOp op);  // the result is bool: comparisons, && and ||

struct Node;
using Ex = std::shared_ptr<const Node>;

// An expression. Immutable; subtrees are shared freely (a printer prints a shared subtree
// once per use, so templates bind anything used twice to a `let` first).
struct Node {
  enum Kind : uint8_t {
    kVar,      // name
    kLit,      // f (kF32), i (integers, bool)
    kUnary,    // un_op
    kBinary,   // bin_op
    kCall,     // op: a builtin of the dialect table (exp, min, select, fma, ...)
    kLoad,     // args[0] index; space/slot (kGlobal: a word of slot `slot`) or name (shared/private array)
    kConvert,  // value conversion to ty
    kBitcast,  // bit reinterpretation to ty (32-bit types only)
    kParam,    // the dispatch's param number `slot` (stored as u32, read as i32)
  } kind = kLit;
  Ty ty = Ty::kI32;
  std::string op;  // kCall: the builtin; kVar / kLoad of arrays: the name
  UnOp un_op = UnOp::kNeg;     // kUnary
  BinOp bin_op = BinOp::kAdd;  // kBinary
  std::vector<Ex> args;
  double f = 0;
  int64_t i = 0;
  int32_t slot = -1;
  Space space = Space::kGlobal;
};

struct Stmt {
  enum Kind : uint8_t {
    kLet,      // immutable: name = value
    kVar,      // mutable: name: ty = value (value may be null: zero)
    kArray,    // private array: name: array<ty, count>
    kAssign,   // name (or name[index] when index) = value
    kStore,    // global word store: slot[index] = value (value is u32)
    kStoreBits,  // slot[index] = (slot[index] & ~mask) | value, atomically per bit (value, mask: u32)
    kSharedStore,  // name[index] = value
    kFor,      // for (var name: i32 = begin; name < end; name += step) body
    kIf,       // if (cond) body else orelse
    kBarrier,  // workgroup barrier (memory and execution)
    kBreak,
    kReturn,
  } kind = kLet;
  std::string name;
  Ty ty = Ty::kI32;
  Ex value, index, cond, begin, end, step, mask;
  int32_t slot = -1;
  int64_t count = 0;
  std::vector<Stmt> body, orelse;
};

struct SharedArray {
  std::string name;
  Ty ty = Ty::kF32;
  int64_t count = 0;
};

struct Slot {
  bool writable = false;
  bool atomic = false;  // has kStoreBits stores
};

struct Kernel {
  std::string name;                 // e.g. "reduce_sum"
  bool subgroups = false;           // uses subgroup operations (the sg_size and sg_lane variables)
  int workgroup_size = 256;
  int64_t workgroups = 1;           // logical (linear) workgroup count
  int64_t grid_x = 1, grid_y = 1;   // after legalization: grid_x * grid_y >= workgroups
  int params = 0;                   // u32 params p0 .. p{params-1}
  std::vector<Slot> slots;
  std::vector<SharedArray> shared;
  std::vector<Stmt> body;
};

// ---- building expressions ----------------------------------------------------------------

Ex var(const std::string& name, Ty ty);
Ex lit_f(double v);
Ex lit_i(int64_t v);
Ex lit_u(uint64_t v);
Ex lit_b(bool v);
Ex lit(Ty ty, double v);  // the value in type ty
Ex param(int index);      // i32 (the uniform's u32, converted)
Ex un(UnOp op, Ex a);
// Binary operation; comparisons and logical ops are bool, the rest take a's type. Integer
// identities (x + 0, x * 1, x * 0, x / 1) fold to an operand.
Ex bin(BinOp op, Ex a, Ex b);
Ex call(const char* fn, Ty ty, std::vector<Ex> args);
Ex select(Ex if_false, Ex if_true, Ex cond);  // cond ? if_true : if_false
Ex convert(Ty ty, Ex a);
Ex bitcast(Ty ty, Ex a);
Ex load_word(int slot, Ex index);                      // u32 word of a global slot
Ex load_array(Space space, const std::string& name, Ty ty, Ex index);
bool is_lit(const Ex& e, int64_t v);  // e is the integer literal v

// ---- operator helpers (in the manner of Halide's IROperator.h) ---------------------------
// Arithmetic and bitwise operators on expressions build bin() and un() nodes: `a + b * c`,
// `(x >> s) & m`, `-a`, `~a`. Comparisons and logical operators are named functions (eq, lt,
// land, lnot, ...): Ex is a shared pointer, whose ==, <, ! and && already mean pointer
// comparison and null tests. C++ leaves open the order in which an operator's operands (like
// a call's arguments) are evaluated: where both operands add statements (Block::let, which
// numbers the printed names), the templates write bin(op, a, b), whose arguments the compiler
// orders as every other call's, so the printed text does not change with the spelling.
inline Ex operator+(Ex a, Ex b) { return bin(BinOp::kAdd, std::move(a), std::move(b)); }
inline Ex operator-(Ex a, Ex b) { return bin(BinOp::kSub, std::move(a), std::move(b)); }
inline Ex operator*(Ex a, Ex b) { return bin(BinOp::kMul, std::move(a), std::move(b)); }
inline Ex operator/(Ex a, Ex b) { return bin(BinOp::kDiv, std::move(a), std::move(b)); }
inline Ex operator%(Ex a, Ex b) { return bin(BinOp::kRem, std::move(a), std::move(b)); }
inline Ex operator&(Ex a, Ex b) { return bin(BinOp::kBitAnd, std::move(a), std::move(b)); }
inline Ex operator|(Ex a, Ex b) { return bin(BinOp::kBitOr, std::move(a), std::move(b)); }
inline Ex operator^(Ex a, Ex b) { return bin(BinOp::kBitXor, std::move(a), std::move(b)); }
inline Ex operator<<(Ex a, Ex b) { return bin(BinOp::kShl, std::move(a), std::move(b)); }
inline Ex operator>>(Ex a, Ex b) { return bin(BinOp::kShr, std::move(a), std::move(b)); }
inline Ex operator-(Ex a) { return un(UnOp::kNeg, std::move(a)); }
inline Ex operator~(Ex a) { return un(UnOp::kBitNot, std::move(a)); }
inline Ex eq(Ex a, Ex b) { return bin(BinOp::kEq, std::move(a), std::move(b)); }
inline Ex ne(Ex a, Ex b) { return bin(BinOp::kNe, std::move(a), std::move(b)); }
inline Ex lt(Ex a, Ex b) { return bin(BinOp::kLt, std::move(a), std::move(b)); }
inline Ex le(Ex a, Ex b) { return bin(BinOp::kLe, std::move(a), std::move(b)); }
inline Ex gt(Ex a, Ex b) { return bin(BinOp::kGt, std::move(a), std::move(b)); }
inline Ex ge(Ex a, Ex b) { return bin(BinOp::kGe, std::move(a), std::move(b)); }
inline Ex land(Ex a, Ex b) { return bin(BinOp::kAnd, std::move(a), std::move(b)); }
inline Ex lor(Ex a, Ex b) { return bin(BinOp::kOr, std::move(a), std::move(b)); }
inline Ex lnot(Ex a) { return un(UnOp::kNot, std::move(a)); }
// The dialect's min and max builtins, in a's type (float32: as the builtin treats NaN; the
// elementwise maximum and minimum propagate it, elementwise.cpp).
inline Ex min(Ex a, Ex b) {
  const Ty t = a->ty;
  return call("min", t, {std::move(a), std::move(b)});
}
inline Ex max(Ex a, Ex b) {
  const Ty t = a->ty;
  return call("max", t, {std::move(a), std::move(b)});
}

// ---- building statements -----------------------------------------------------------------

// Appends statements to a block; names temporaries uniquely within a kernel.
class Block {
 public:
  Block(std::vector<Stmt>* out, int* counter) : out_(out), counter_(counter) {}
  // Binds e to a new immutable name (literals and variables are returned as they are).
  Ex let(Ex e, const char* hint = "t");
  Ex mut(Ty ty, Ex init, const char* hint = "v");  // a mutable variable
  void assign(const Ex& v, Ex value);
  void array(const std::string& name, Ty ty, int64_t count);
  void assign_elem(const std::string& name, Ex index, Ex value);
  void store(int slot, Ex index, Ex word);
  // Replaces the bits of word `index` under `mask` by `bits` (already in place); the caller
  // marks the slot atomic.
  void store_bits(int slot, Ex index, Ex bits, Ex mask);
  void shared_store(const std::string& name, Ex index, Ex value);
  void barrier();
  void brk();
  void ret();
  // for (var name = begin; name < end; name += step); returns the loop variable to the body.
  template <class F> void loop(const char* hint, Ex begin, Ex end, Ex step, F body) {
    Stmt s;
    s.kind = Stmt::kFor;
    s.name = fresh(hint);
    s.begin = std::move(begin);
    s.end = std::move(end);
    s.step = std::move(step);
    Block inner(&s.body, counter_);
    body(inner, var(s.name, Ty::kI32));
    out_->push_back(std::move(s));
  }
  template <class F, class G> void if_else(Ex cond, F then, G orelse) {
    Stmt s;
    s.kind = Stmt::kIf;
    s.cond = std::move(cond);
    Block a(&s.body, counter_), b(&s.orelse, counter_);
    then(a);
    orelse(b);
    out_->push_back(std::move(s));
  }
  template <class F> void if_(Ex cond, F then) {
    if_else(std::move(cond), std::move(then), [](Block&) {});
  }
  std::string fresh(const char* hint);
  int* counter() const { return counter_; }

 private:
  std::vector<Stmt>* out_;
  int* counter_;
};

}  // namespace chroma::gpu

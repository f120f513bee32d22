// Parser for the text form of the IR (the inverse of print(), see printer.cpp), so golden
// tests can start from IR text. Node ids must be 0, 1, 2, ... in order. Constants take their
// data from a `data=[...]` attribute (zeros when absent).
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "chroma/linalg_kinds.h"
#include "ir/graph.h"

namespace chroma {
namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  Graph run() {
    expect_word("graph");
    expect('{');
    for (;;) {
      skip();
      if (peek_word("return")) break;
      statement();
    }
    expect_word("return");
    skip();
    if (!at('}')) {
      for (;;) {
        g_.outputs.push_back(value());
        skip();
        if (!at(',')) break;
        ++pos_;
      }
    }
    expect('}');
    return std::move(g_);
  }

 private:
  const std::string& s_;
  size_t pos_ = 0;
  Graph g_;
  std::vector<Value> ids_;  // text id -> value

  [[noreturn]] void fail(const std::string& what) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw CompileError("IR text line " + std::to_string(line) + ":" + std::to_string(col) + ": " + what);
  }
  void skip() {
    for (;;) {
      while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      if (s_.compare(pos_, 2, "//") == 0) {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
        continue;
      }
      return;
    }
  }
  bool at(char c) {
    skip();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  void expect(char c) {
    if (!at(c)) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string word() {
    skip();
    size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    if (b == pos_) fail("expected a name");
    return s_.substr(b, pos_ - b);
  }
  bool peek_word(const char* w) {
    skip();
    return s_.compare(pos_, std::strlen(w), w) == 0;
  }
  void expect_word(const char* w) {
    if (word() != w) fail(std::string("expected '") + w + "'");
  }
  std::string number_text() {
    skip();
    size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || std::strchr("+-.", s_[pos_]))) ++pos_;
    if (b == pos_) fail("expected a number");
    return s_.substr(b, pos_ - b);
  }
  int64_t integer() {
    const std::string t = number_text();
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (*end) fail("expected an integer, got '" + t + "'");
    return v;
  }
  Scalar scalar() {
    const std::string t = number_text();
    if (t == "inf") return Scalar::of_float(INFINITY);
    if (t == "-inf") return Scalar::of_float(-INFINITY);
    if (t == "nan") return Scalar::of_float(NAN);
    if (t.find_first_of(".eE") == std::string::npos) {
      char* end = nullptr;
      const long long v = std::strtoll(t.c_str(), &end, 10);
      if (*end) fail("bad number '" + t + "'");
      return Scalar::of_int(v);
    }
    return Scalar::of_float(std::strtod(t.c_str(), nullptr));
  }
  template <class F> void list(F&& item) {
    expect('[');
    if (at(']')) {
      ++pos_;
      return;
    }
    for (;;) {
      item();
      if (at(',')) {
        ++pos_;
        continue;
      }
      expect(']');
      return;
    }
  }
  std::string quoted() {
    expect('"');
    size_t b = pos_;
    while (pos_ < s_.size() && s_[pos_] != '"') ++pos_;
    if (pos_ >= s_.size()) fail("unterminated string");
    return s_.substr(b, pos_++ - b);
  }
  // Digits only: "%4.1" is output 1 of node 4, not the number 4.1.
  int64_t digits() {
    skip();
    const size_t b = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (b == pos_) fail("expected an integer");
    return std::strtoll(s_.substr(b, pos_ - b).c_str(), nullptr, 10);
  }
  Value value() {
    expect('%');
    const int64_t id = digits();
    if (id < 0 || id >= static_cast<int64_t>(ids_.size())) fail("%" + std::to_string(id) + " is not defined yet");
    Value v = ids_[static_cast<size_t>(id)];
    if (at('.')) {
      ++pos_;
      v.index = static_cast<int32_t>(digits());
    }
    return v;
  }
  TensorType type() {
    static const std::map<std::string, DType> kShort = {{"f32", DType::kF32}, {"f64", DType::kF64}, {"i64", DType::kI64},
                                                        {"i32", DType::kI32}, {"i16", DType::kI16}, {"i8", DType::kI8},
                                                        {"u8", DType::kU8},   {"bool", DType::kBool}, {"f16", DType::kF16},
                                                        {"bf16", DType::kBF16}};
    const std::string w = word();
    auto it = kShort.find(w);
    if (it == kShort.end()) fail("unknown element type '" + w + "'");
    TensorType t;
    t.dtype = it->second;
    list([&] { t.shape.push_back(integer()); });
    return t;
  }

  ReduceKind reduction(const std::string& sub) {
    const std::map<std::string, ReduceKind> k = {{"sum", ReduceKind::kSum}, {"prod", ReduceKind::kProd},
                                                 {"max", ReduceKind::kMax}, {"min", ReduceKind::kMin}};
    if (!k.count(sub)) fail("unknown reduction '" + sub + "'");
    return k.at(sub);
  }

  static int linalg_flag(const std::string& key) {
    for (int i = 0; i < 6; ++i) {
      if (key == linalg::kFlagNames[i]) return i;
    }
    return -1;
  }

  void statement() {
    expect('%');
    const int64_t id = integer();
    if (id != static_cast<int64_t>(ids_.size())) fail("node ids must count up from 0; expected %" + std::to_string(ids_.size()));
    expect('=');
    const std::string opname = word();
    Op op = Op::kCount;
    for (int i = 0; i < static_cast<int>(Op::kCount); ++i) {
      if (op_info(static_cast<Op>(i)).name == opname) op = static_cast<Op>(i);
    }
    if (op == Op::kCount) fail("unknown op '" + opname + "'");
    Attrs a;
    if (at('.')) {
      ++pos_;
      const std::string sub = word();
      if (op == Op::kMap) {
        if (!parse_ew(sub, &a.ew)) fail("unknown elementwise op '" + sub + "'");
      } else if (op == Op::kReduce || op == Op::kArgReduce || op == Op::kScan) {
        a.reduce = reduction(sub);
      } else if (op == Op::kLinalg) {
        a.k = -1;
        for (int i = 0; i < linalg::kKindCount; ++i) {
          if (sub == linalg::kKindNames[i]) a.k = i;
        }
        if (a.k < 0) fail("unknown factorization '" + sub + "'");
      } else {
        fail(opname + " takes no '." + sub + "'");
      }
    }
    std::vector<Value> inputs;
    expect('(');
    if (!at(')')) {
      for (;;) {
        inputs.push_back(value());
        if (!at(',')) break;
        ++pos_;
      }
    }
    expect(')');
    std::string name;
    std::vector<double> data;
    bool has_data = false;
    if (at('{')) {
      ++pos_;
      while (!at('}')) {
        const std::string key = word();
        if (key == "keepdim") a.keepdim = true;
        else if (key == "largest") a.largest = true;
        else if (key == "smallest") a.largest = false;
        else if (key == "sorted") a.sorted = true;
        else if (key == "log") a.log = true;
        else if (op == Op::kLinalg && linalg_flag(key) >= 0) a.start |= int64_t{1} << linalg_flag(key);
        else if (key == "accumulate") {
          a.accumulate = true;
          if (at('=')) {
            ++pos_;
            a.reduce = reduction(word());
          }
        }
        else {
          expect('=');
          if (key == "name") name = quoted();
          else if (key == "index" || key == "slot") a.index = integer();
          else if (key == "axis") a.axis = integer();
          else if (key == "start") a.start = integer();
          else if (key == "end") a.end = integer();
          else if (key == "step") a.step = integer();
          else if (key == "k" || key == "groups") a.k = integer();
          else if (key == "value" || key == "base" || key == "scale") a.scalar = scalar();
          else if (key == "divide") {
            a.scalar = scalar();
            a.k = 1;
          }
          else if (key == "perm" || key == "axes" || key == "window") list([&] { a.ints.push_back(integer()); });
          else if (key == "coeffs") list([&] { a.coeffs.push_back(scalar().as_double()); });
          else if (key == "data") {
            has_data = true;
            list([&] { data.push_back(scalar().as_double()); });
          } else if (key == "dtype") {
            const std::string d = word();
            if (!parse_dtype(d, &a.dtype)) fail("unknown dtype '" + d + "'");
          } else {
            fail("unknown attribute '" + key + "'");
          }
        }
        if (at(',')) ++pos_;
      }
      expect('}');
    }
    expect(':');
    std::vector<TensorType> types{type()};
    while (at(',')) {
      ++pos_;
      types.push_back(type());
    }
    g_.set_origin(name, "");
    Value v;
    if (op == Op::kInput) {
      v = g_.input(name.empty() ? "in" + std::to_string(g_.inputs.size()) : name, types[0]);
    } else if (op == Op::kConstant) {
      ConstantData c;
      c.type = types[0];
      c.name = name;
      std::vector<uint8_t> bytes(static_cast<size_t>(c.type.nbytes()), 0);
      if (has_data) {
        if (static_cast<int64_t>(data.size()) != c.type.numel()) fail("data has " + std::to_string(data.size()) + " values, the type needs " + std::to_string(c.type.numel()));
        for (size_t i = 0; i < data.size(); ++i) store(c.type.dtype, bytes.data(), i, data[i]);
      }
      c.bytes = make_blob(std::move(bytes));
      v = g_.constant(std::move(c));
    } else {
      if (op == Op::kExpand || op == Op::kReshape || op == Op::kFull || op == Op::kIota) a.ints = types[0].shape;
      if (op == Op::kFull || op == Op::kIota || op == Op::kCast) a.dtype = types[0].dtype;
      v = g_.add(op, inputs, a);
      if (g_.node(v).types != types) fail("declared types do not match the inferred ones for " + opname);
    }
    ids_.push_back(v);
  }

  static void store(DType t, uint8_t* p, size_t i, double v) {
    switch (t) {
#define X(e, n, c, b)                        \
  case DType::e:                             \
    reinterpret_cast<c*>(p)[i] = static_cast<c>(v); \
    break;
      CHROMA_FOR_EACH_DTYPE(X)
#undef X
    }
  }
};

}  // namespace

Graph parse(const std::string& text) { return Parser(text).run(); }

}  // namespace chroma

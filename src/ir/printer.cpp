// The text form of the IR and the verifier.
//
//   %2 = Map.add(%0, %1) : f32[4,7]
//   %3 = Reduce.sum(%2) {axes=[1]} : f32[4]
//   %4 = TopK(%3) {axis=0, k=2, largest, sorted} : f32[2], i64[2]
//   return %3, %4.1
//
// Golden tests match lines of this form, so keep it stable and readable.
#include <sstream>
#include <type_traits>

#include "chroma/linalg_kinds.h"
#include "ir/graph.h"

namespace chroma {
namespace {

std::string value_str(Value v) {
  std::string s = "%" + std::to_string(v.node);
  if (v.index) s += "." + std::to_string(v.index);
  return s;
}

// Small constants print their values, so golden tests can check folded results and the
// parser can read them back.
constexpr int64_t kPrintDataLimit = 16;

template <class T> std::string element_str(T v) {
  if constexpr (kIsHalf<T>) return Scalar::of_float(static_cast<float>(v)).str();
  else if constexpr (std::is_floating_point_v<T>) return Scalar::of_float(static_cast<double>(v)).str();
  else return std::to_string(static_cast<int64_t>(v));
}

std::string data_str(const ConstantData& c) {
  std::string r = "[";
  const int64_t n = c.type.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (i) r += ", ";
    switch (c.type.dtype) {
#define X(e, nm, ct, b)                                                                      \
  case DType::e: {                                                                           \
    r += element_str(reinterpret_cast<const ct*>(c.data())[i]);                              \
    break;                                                                                   \
  }
      CHROMA_FOR_EACH_DTYPE(X)
#undef X
    }
  }
  return r + "]";
}

std::string attrs_str(const Graph& g, const Node& n) {
  const Attrs& a = n.attrs;
  std::ostringstream o;
  switch (n.op) {
    case Op::kInput: o << "index=" << a.index << ", name=\"" << g.inputs[static_cast<size_t>(a.index)].name << "\""; break;
    case Op::kConstant: {
      const ConstantData& c = g.constants[static_cast<size_t>(a.index)];
      o << "slot=" << a.index;
      if (!c.name.empty()) o << ", name=\"" << c.name << "\"";
      if (c.type.numel() <= kPrintDataLimit) o << ", data=" << data_str(c);
      break;
    }
    case Op::kCast: o << "dtype=" << dtype_name(a.dtype); break;
    case Op::kFull: o << "value=" << a.scalar.str(); break;
    case Op::kIota: {
      o << "base=" << a.scalar.str() << ", coeffs=[";
      for (size_t i = 0; i < a.coeffs.size(); ++i) o << (i ? "," : "") << Scalar::of_float(a.coeffs[i]).str();
      o << "]";
      break;
    }
    case Op::kPermute: o << "perm=" << shape_str(a.ints); break;
    case Op::kFlip: o << "axes=" << shape_str(a.ints); break;
    case Op::kReduce: o << "axes=" << shape_str(a.ints) << (a.keepdim ? ", keepdim" : ""); break;
    case Op::kArgReduce: o << "axis=" << a.axis << (a.keepdim ? ", keepdim" : ""); break;
    case Op::kSoftmax: o << "axis=" << a.axis << (a.log ? ", log" : ""); break;
    case Op::kAttention: o << (a.k ? "divide=" : "scale=") << a.scalar.str(); break;
    case Op::kSlice: o << "axis=" << a.axis << ", start=" << a.start << ", end=" << a.end << ", step=" << a.step; break;
    case Op::kGather: case Op::kGatherElements: case Op::kConcat: o << "axis=" << a.axis; break;
    case Op::kIndexPut:
      o << "axis=" << a.axis << (a.accumulate ? ", accumulate" : "");
      if (a.accumulate && a.reduce != ReduceKind::kSum) o << "=" << reduce_name(a.reduce);
      if (a.accumulate && is_half(a.dtype)) o << ", round=" << dtype_name(a.dtype);
      break;
    case Op::kScan: o << "axis=" << a.axis << (a.log ? ", log" : ""); break;
    case Op::kConv: o << "window=" << shape_str(a.ints) << ", groups=" << a.k; break;
    case Op::kTopK:
      o << "axis=" << a.axis << ", k=" << a.k << (a.largest ? ", largest" : ", smallest") << (a.sorted ? ", sorted" : "");
      break;
    case Op::kLinalg: {
      const char* sep = "";
      for (int i = 0; i < 6; ++i) {
        if (a.start & (1 << i)) {
          o << sep << linalg::kFlagNames[i];
          sep = ", ";
        }
      }
      break;
    }
    default: break;
  }
  return o.str();
}

}  // namespace

std::string print(const Graph& g) {
  std::ostringstream o;
  o << "graph {\n";
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const Node& n = g.nodes()[id];
    o << "  %" << id << " = " << op_info(n.op).name;
    if (n.op == Op::kMap) o << "." << ew_info(n.attrs.ew).name;
    if (n.op == Op::kLinalg) o << "." << (n.attrs.k >= 0 && n.attrs.k < linalg::kKindCount ? linalg::kKindNames[n.attrs.k] : "?");
    if (n.op == Op::kReduce || n.op == Op::kArgReduce || n.op == Op::kScan) o << "." << reduce_name(n.attrs.reduce);
    o << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) o << (i ? ", " : "") << value_str(n.inputs[i]);
    o << ")";
    std::string at = attrs_str(g, n);
    if (!at.empty()) o << " {" << at << "}";
    o << " :";
    for (size_t i = 0; i < n.types.size(); ++i) o << (i ? ", " : " ") << n.types[i].str();
    o << "\n";
  }
  o << "  return";
  for (size_t i = 0; i < g.outputs.size(); ++i) o << (i ? ", " : " ") << value_str(g.outputs[i]);
  o << "\n}\n";
  return o.str();
}

std::string verify(const Graph& g) {
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const Node& n = g.nodes()[id];
    for (const Value& v : n.inputs) {
      if (v.node < 0 || static_cast<size_t>(v.node) >= id) return "%" + std::to_string(id) + " reads a later or invalid node";
      if (v.index >= static_cast<int32_t>(g.node(v.node).types.size())) return "%" + std::to_string(id) + " reads a missing output";
    }
    std::vector<TensorType> t;
    try {
      t = infer_types(g, n.op, n.inputs, n.attrs);
    } catch (const CompileError& e) {
      return g.describe(static_cast<int32_t>(id)) + ": " + e.what();
    }
    if (t != n.types) return g.describe(static_cast<int32_t>(id)) + ": stored types differ from inferred types";
    if (n.op == Op::kConstant) {
      const ConstantData& c = g.constants.at(static_cast<size_t>(n.attrs.index));
      if (c.type != n.types[0] || static_cast<int64_t>(c.bytes->size()) < c.type.nbytes()) {
        return g.describe(static_cast<int32_t>(id)) + ": constant data does not match its type";
      }
    }
  }
  for (const Value& v : g.outputs) {
    if (v.node < 0 || static_cast<size_t>(v.node) >= g.nodes().size()) return "graph output refers to a missing node";
  }
  for (const GraphInput& in : g.inputs) {
    if (in.node < 0 || g.node(in.node).op != Op::kInput) return "graph input '" + in.name + "' is not an Input node";
  }
  return "";
}

}  // namespace chroma

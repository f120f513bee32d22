#include "import/importer.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "import/aten.h"

namespace chroma {
namespace {

constexpr char kMagic[8] = {'C', 'H', 'R', 'G', 'R', 'A', 'P', 'H'};
constexpr uint32_t kFormatVersion = 1;

template <class T> T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

struct GraphFile {
  json meta;
  std::vector<uint8_t> bytes;
  uint64_t data_offset = 0, data_length = 0;
};

GraphFile read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CompileError("cannot open graph file '" + path + "'");
  GraphFile gf;
  gf.bytes.assign(std::istreambuf_iterator<char>(f), {});
  const auto& b = gf.bytes;
  auto bad = [&](const std::string& why) { return CompileError("graph file '" + path + "': " + why); };
  if (b.size() < 64) throw bad("truncated header (" + std::to_string(b.size()) + " bytes)");
  if (std::memcmp(b.data(), kMagic, 8) != 0) throw bad("bad magic (not a Chroma graph file)");
  const uint32_t version = read_le<uint32_t>(b.data() + 8);
  if (version != kFormatVersion) {
    throw bad("format version " + std::to_string(version) + " is not supported (this compiler reads version " +
              std::to_string(kFormatVersion) + ")");
  }
  const uint64_t json_off = read_le<uint64_t>(b.data() + 16), json_len = read_le<uint64_t>(b.data() + 24);
  gf.data_offset = read_le<uint64_t>(b.data() + 32);
  gf.data_length = read_le<uint64_t>(b.data() + 40);
  if (json_off + json_len > b.size() || gf.data_offset + gf.data_length > b.size()) throw bad("truncated file");
  try {
    gf.meta = json::parse(b.begin() + static_cast<long>(json_off), b.begin() + static_cast<long>(json_off + json_len));
  } catch (const json::exception& e) {
    throw bad(std::string("malformed JSON: ") + e.what());
  }
  return gf;
}

std::string where(const json& node) {
  std::string s = "node '" + node.value("name", std::string("?")) + "' (" + node.value("target", std::string("?")) + ")";
  const std::string src = node.value("source", std::string());
  if (!src.empty()) s += " at " + src;
  return s;
}

TensorType parse_type(const json& j, const std::string& what) {
  TensorType t;
  const std::string dt = j.at("dtype").get<std::string>();
  if (!parse_dtype(dt, &t.dtype)) throw CompileError(what + ": dtype " + dt + " is not supported");
  t.shape = j.at("shape").get<std::vector<int64_t>>();
  return t;
}

}  // namespace

// Ops that cannot be compiled by design, with the reason (matched on the op name, any overload).
std::string refusal(const std::string& target) {
  std::string op = target;
  if (op.rfind("aten.", 0) == 0) op = op.substr(5);
  op = op.substr(0, op.find('.'));
  static const char* kDataDependent =
      "its output shape depends on the input values (data-dependent shape); Chroma compiles fixed shapes only";
  static const char* kRandom =
      "random-number ops are not supported: Chroma programs are deterministic and cannot reproduce PyTorch's "
      "generator (call model.eval() to disable dropout)";
  static const char* kComplex = "FFTs produce complex tensors; complex dtypes are not supported";
  static const char* kSymbolic =
      "a symbolic-shape query: in a fixed-shape graph every size is a constant (export with static shapes)";
  static const std::map<std::string, const char*> kRefused = {
      {"nonzero", kDataDependent}, {"masked_select", kDataDependent},
      {"unique", kDataDependent}, {"_unique2", kDataDependent}, {"unique_consecutive", kDataDependent},
      {"unique_dim", kDataDependent}, {"argwhere", kDataDependent},
      {"rand", kRandom}, {"rand_like", kRandom}, {"randn", kRandom}, {"randn_like", kRandom},
      {"randint", kRandom}, {"randint_like", kRandom}, {"randperm", kRandom}, {"bernoulli", kRandom},
      {"normal", kRandom}, {"uniform", kRandom}, {"multinomial", kRandom},
      {"exponential", kRandom}, {"geometric", kRandom}, {"cauchy", kRandom}, {"log_normal", kRandom},
      {"poisson", kRandom}, {"rrelu_with_noise", kRandom}, {"rrelu_with_noise_functional", kRandom}, {"random", kRandom},
      {"_fft_r2c", kComplex}, {"_fft_c2r", kComplex}, {"_fft_c2c", kComplex},
      {"sym_size", kSymbolic}, {"sym_numel", kSymbolic}, {"sym_stride", kSymbolic},
      {"sym_storage_offset", kSymbolic}, {"sym_is_contiguous", kSymbolic},
  };
  auto it = kRefused.find(op);
  return it == kRefused.end() ? std::string() : std::string(it->second);
}

// ---- Call ---------------------------------------------------------------------------------

Call::Call(const json& node, Builder& builder, const std::unordered_map<std::string, std::vector<Value>>& values)
    : b(builder), node_(node), target_(node.at("target").get<std::string>()), values_(values) {}

void Call::fail(const std::string& msg) const { throw CompileError(where(node_) + ": " + msg); }

std::optional<Call> Call::fused() const {
  if (!fused_) return std::nullopt;
  return Call(*fused_, b, values_);
}

const json* Call::get(size_t i, const char* name) const {
  const json& args = node_.at("args");
  const json* r = nullptr;
  if (i < args.size()) r = &args[i];
  else if (node_.contains("kwargs") && name && node_["kwargs"].contains(name)) r = &node_["kwargs"][name];
  return (r && !r->is_null()) ? r : nullptr;
}

Value Call::ref(const json& j, const char* name) const {
  if (!j.is_object() || !j.contains("ref")) fail(std::string("argument '") + name + "' is not a tensor");
  const std::string r = j["ref"].get<std::string>();
  auto it = values_.find(r);
  if (it == values_.end()) fail("argument '" + std::string(name) + "' refers to unknown value '" + r + "'");
  const size_t k = j.value("index", 0);
  if (k >= it->second.size()) fail("argument '" + std::string(name) + "' refers to missing output " + std::to_string(k) + " of '" + r + "'");
  return it->second[k];
}

bool Call::is_tensor(size_t i, const char* name) const {
  const json* j = get(i, name);
  return j && j->is_object() && j->contains("ref");
}

Value Call::tensor(size_t i, const char* name) const {
  const json* j = get(i, name);
  if (!j) fail(std::string("missing tensor argument '") + name + "'");
  return ref(*j, name);
}

std::vector<Value> Call::tensors(size_t i, const char* name) const {
  const json* j = get(i, name);
  if (!j || !j->is_array()) fail(std::string("argument '") + name + "' must be a list of tensors");
  std::vector<Value> r;
  for (const json& e : *j) r.push_back(ref(e, name));
  return r;
}

std::vector<std::optional<Value>> Call::opt_tensors(size_t i, const char* name) const {
  const json* j = get(i, name);
  if (!j || !j->is_array()) fail(std::string("argument '") + name + "' must be a list");
  std::vector<std::optional<Value>> r;
  for (const json& e : *j) {
    if (e.is_null()) r.push_back(std::nullopt);
    else r.push_back(ref(e, name));
  }
  return r;
}

int64_t Call::int_(size_t i, const char* name) const {
  const json* j = get(i, name);
  if (!j || !(j->is_number_integer() || j->is_boolean())) fail(std::string("argument '") + name + "' must be an integer");
  return j->is_boolean() ? static_cast<int64_t>(j->get<bool>()) : j->get<int64_t>();
}

int64_t Call::int_or(size_t i, const char* name, int64_t dflt) const { return has(i, name) ? int_(i, name) : dflt; }

Scalar Call::scalar(size_t i, const char* name) const {
  const json* j = get(i, name);
  if (!j) fail(std::string("missing scalar argument '") + name + "'");
  if (j->is_boolean()) return Scalar::of_int(j->get<bool>() ? 1 : 0);
  if (j->is_number_integer()) return Scalar::of_int(j->get<int64_t>());
  if (j->is_object() && j->contains("float")) {
    const json& f = (*j)["float"];
    if (f.is_string()) {
      const std::string s = f.get<std::string>();
      if (s == "inf") return Scalar::of_float(INFINITY);
      if (s == "-inf") return Scalar::of_float(-INFINITY);
      return Scalar::of_float(NAN);
    }
    return Scalar::of_float(f.get<double>());
  }
  fail(std::string("argument '") + name + "' must be a number");
}

double Call::float_or(size_t i, const char* name, double dflt) const {
  return has(i, name) ? scalar(i, name).as_double() : dflt;
}

bool Call::bool_or(size_t i, const char* name, bool dflt) const {
  const json* j = get(i, name);
  if (!j) return dflt;
  if (!j->is_boolean()) fail(std::string("argument '") + name + "' must be a bool");
  return j->get<bool>();
}

std::vector<int64_t> Call::ints(size_t i, const char* name) const {
  const json* j = get(i, name);
  if (!j) return {};
  if (j->is_number_integer()) return {j->get<int64_t>()};
  if (!j->is_array()) fail(std::string("argument '") + name + "' must be a list of integers");
  std::vector<int64_t> r;
  for (const json& e : *j) {
    if (!e.is_number_integer()) fail(std::string("argument '") + name + "' must be a list of integers");
    r.push_back(e.get<int64_t>());
  }
  return r;
}

std::optional<DType> Call::dtype(size_t i, const char* name) const {
  const json* j = get(i, name);
  if (!j) return std::nullopt;
  if (!j->is_object() || !j->contains("dtype")) fail(std::string("argument '") + name + "' must be a dtype");
  DType t;
  const std::string s = (*j)["dtype"].get<std::string>();
  if (!parse_dtype(s, &t)) fail("dtype " + s + " is not supported yet");
  return t;
}

std::string Call::str_or(size_t i, const char* name, const std::string& dflt) const {
  const json* j = get(i, name);
  if (!j) return dflt;
  if (j->is_object() && j->contains("str")) return (*j)["str"].get<std::string>();
  fail(std::string("argument '") + name + "' must be a string");
}

Operand Call::operand(size_t i, const char* name) const {
  if (is_tensor(i, name)) return Operand::of(tensor(i, name));
  return Operand::of(scalar(i, name));
}

TensorType Call::out_type(size_t k) const {
  const json& outs = node_.at("outputs");
  if (k >= outs.size()) fail("the exporter recorded no output " + std::to_string(k));
  return parse_type(outs[k], where(node_));
}

// ---- handler table ----------------------------------------------------------------------

const HandlerTable& aten_handlers() {
  static const HandlerTable table = [] {
    HandlerTable t;
    register_aten_elementwise(t);
    register_aten_shape(t);
    register_aten_reduce(t);
    register_aten_linalg(t);
    register_aten_index(t);
    register_aten_conv(t);
    register_aten_pool(t);
    register_aten_upsample(t);
    register_aten_norm(t);
    register_aten_misc(t);
    register_aten_search(t);
    register_aten_backward(t);
    register_aten_extra(t);
    register_aten_special(t);
    register_aten_lapack(t);
    return t;
  }();
  return table;
}

std::vector<std::string> supported_aten_targets() {
  std::vector<std::string> r;
  for (const auto& [k, v] : aten_handlers()) r.push_back(k);
  return r;
}

// ---- the import -------------------------------------------------------------------------

namespace {

// Counts the references to each (node, output index) in `j` (an ARG-encoded value).
void count_refs(const json& j, std::map<std::pair<std::string, int>, int>& uses) {
  if (j.is_object() && j.contains("ref")) {
    ++uses[{j["ref"].get<std::string>(), j.value("index", 0)}];
  } else if (j.is_array()) {
    for (const json& e : j) count_refs(e, uses);
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items()) count_refs(v, uses);
  }
}

// Inference batch norms folded into the convolution they normalize: conv node name -> BN
// node. The convolution must be non-transposed with a constant weight and bias and be read
// only by the BN, whose parameters are constants and whose statistics outputs are unused.
// Folding scales the weights once at compile time (constant folding) instead of running a
// normalization pass over every activation.
bool no_kwargs(const json& node) { return !node.contains("kwargs") || node["kwargs"].empty(); }

std::map<std::string, const json*> conv_bn_folds(const json& m, const std::set<std::string>& weights) {
  std::map<std::pair<std::string, int>, int> uses;
  for (const json& node : m.at("nodes")) {
    count_refs(node.at("args"), uses);
    if (node.contains("kwargs")) count_refs(node["kwargs"], uses);
  }
  count_refs(m.at("outputs"), uses);
  if (m.contains("state_updates")) count_refs(m["state_updates"], uses);
  auto is_weight_or_none = [&](const json& args, size_t i) {
    if (i >= args.size() || args[i].is_null()) return true;
    return args[i].is_object() && args[i].contains("ref") && weights.count(args[i]["ref"].get<std::string>()) > 0;
  };
  std::map<std::string, const json*> convs;
  for (const json& node : m.at("nodes")) {
    if (node.at("target") == "aten.convolution.default" && no_kwargs(node)) {
      const json& a = node.at("args");
      if (a.size() == 9 && a[6].is_boolean() && !a[6].get<bool>() && is_weight_or_none(a, 1) && !a[1].is_null() &&
          is_weight_or_none(a, 2)) {
        convs[node.at("name").get<std::string>()] = &node;
      }
    }
  }
  std::map<std::string, const json*> folds;
  for (const json& node : m.at("nodes")) {
    if (node.at("target") != "aten._native_batch_norm_legit_no_training.default" || !no_kwargs(node)) continue;
    const json& a = node.at("args");
    if (a.size() != 7 || !a[0].is_object() || !a[0].contains("ref")) continue;
    const std::string src = a[0]["ref"].get<std::string>();
    const std::string name = node.at("name").get<std::string>();
    if (!convs.count(src) || uses[{src, 0}] != 1 || folds.count(src)) continue;
    if (uses[{name, 1}] || uses[{name, 2}]) continue;
    bool ok = true;
    for (size_t i = 1; i <= 4; ++i) ok = ok && is_weight_or_none(a, i);
    if (ok && !a[3].is_null() && !a[4].is_null()) folds[src] = &node;
  }
  return folds;
}

}  // namespace

Graph import_graph_file(const std::string& path) {
  GraphFile gf = read_file(path);
  const json& m = gf.meta;
  if (m.value("format", std::string()) != "chroma.graph") throw CompileError("graph file '" + path + "': not a chroma.graph document");
  const HandlerTable& handlers = aten_handlers();

  std::set<std::string> weight_names;
  for (const json& w : m.at("weights")) {
    if (w.value("kind", std::string()) != "state") weight_names.insert(w.at("name").get<std::string>());
  }
  const std::map<std::string, const json*> folds = conv_bn_folds(m, weight_names);
  std::set<std::string> folded;
  for (const auto& [conv, bn] : folds) folded.insert(bn->at("name").get<std::string>());

  // Report every unsupported op at once, before building anything; ops that cannot be
  // compiled by design say why.
  std::ostringstream unsupported;
  int n_unsupported = 0;
  for (const json& node : m.at("nodes")) {
    const std::string target = node.at("target").get<std::string>();
    const std::string refused = refusal(target);
    if ((!handlers.count(target) && !folded.count(node.at("name").get<std::string>())) || !refused.empty()) {
      ++n_unsupported;
      unsupported << "\n  " << target << " (node '" << node.value("name", std::string("?")) << "')";
      const std::string src = node.value("source", std::string());
      unsupported << (src.empty() ? " at an unknown source line" : " at " + src);
      if (!refused.empty()) unsupported << ": " << refused;
    }
  }
  if (n_unsupported) {
    throw CompileError("the model uses " + std::to_string(n_unsupported) + " unsupported op" +
                       (n_unsupported > 1 ? "s" : "") + ":" + unsupported.str());
  }

  Graph g;
  Builder b(g);
  std::unordered_map<std::string, std::vector<Value>> values;
  for (const json& in : m.at("inputs")) {
    const std::string name = in.at("name").get<std::string>();
    values[name] = {g.input(name, parse_type(in, "input '" + name + "'"))};
  }
  const uint8_t* data = gf.bytes.data() + gf.data_offset;
  // State (buffers the model updates in place) becomes extra graph inputs after the user's,
  // and their new values extra outputs after the user's (see StateBinding).
  std::map<std::string, size_t> state_of;
  for (const json& w : m.at("weights")) {
    const std::string name = w.at("name").get<std::string>();
    ConstantData c;
    c.type = parse_type(w, "weight '" + name + "'");
    c.name = w.value("source", name);
    const uint64_t off = w.at("offset").get<uint64_t>(), nb = w.at("nbytes").get<uint64_t>();
    if (off + nb > gf.data_length || static_cast<int64_t>(nb) != c.type.nbytes()) {
      throw CompileError("graph file '" + path + "': weight '" + name + "' lies outside the data section or has the wrong size");
    }
    c.bytes = std::make_shared<const std::vector<uint8_t>>(data + off, data + off + nb);
    if (w.value("kind", std::string()) == "state") {
      StateBinding s;
      s.name = c.name;
      s.input = static_cast<int32_t>(g.inputs.size());
      s.init = c;
      values[name] = {g.input(c.name, c.type)};
      state_of[s.name] = g.states.size();
      g.states.push_back(std::move(s));
      continue;
    }
    values[name] = {g.constant(std::move(c))};
  }
  for (const json& node : m.at("nodes")) {
    const std::string name = node.at("name").get<std::string>();
    g.set_origin(name, node.value("source", std::string()));
    Call call(node, b, values);
    std::vector<Value> outs;
    if (auto f = folds.find(name); f != folds.end()) call.set_fused(f->second);
    try {
      if (folded.count(name)) {
        // Folded into its convolution: the normalized value is the convolution's output, the
        // (unused) statistics outputs are zeros of the recorded types.
        outs.push_back(call.tensor(0, "input"));
        for (size_t k = 1; k < node.at("outputs").size(); ++k) {
          const TensorType t = call.out_type(k);
          outs.push_back(b.full(Scalar::of_int(0), t.dtype, t.shape));
        }
      } else {
        outs = handlers.at(call.target())(call);
      }
    } catch (const CompileError& e) {
      const std::string msg = e.what();
      if (msg.rfind("node '", 0) == 0) throw;
      call.fail(msg);
    }
    // The exporter recorded each output's type: the decomposition must agree.
    for (size_t k = 0; k < outs.size() && k < node.at("outputs").size(); ++k) {
      if (node.at("outputs")[k].is_null()) continue;  // a Python scalar (item()): kept as a 0-d tensor
      const TensorType want = call.out_type(k);
      if (g.type(outs[k]) != want) {
        call.fail("internal: lowered output " + std::to_string(k) + " has type " + g.type(outs[k]).str() +
                  ", PyTorch says " + want.str());
      }
    }
    values[name] = std::move(outs);
  }
  g.set_origin("", "");
  for (const json& o : m.at("outputs")) {
    const std::string r = o.at("ref").get<std::string>();
    auto it = values.find(r);
    if (it == values.end()) throw CompileError("graph output refers to unknown value '" + r + "'");
    g.outputs.push_back(it->second.at(o.value("index", 0)));
  }
  g.output_structure = m.value("output_structure", std::string("single"));
  if (m.contains("state_updates")) {
    for (const json& u : m.at("state_updates")) {
      const std::string st = u.at("state").get<std::string>();
      auto s = state_of.find(st);
      if (s == state_of.end()) throw CompileError("graph file '" + path + "': state update of unknown state '" + st + "'");
      const std::string r = u.at("ref").get<std::string>();
      auto it = values.find(r);
      if (it == values.end()) throw CompileError("state update of '" + st + "' refers to unknown value '" + r + "'");
      const Value v = it->second.at(u.value("index", 0));
      if (g.type(v) != g.states[s->second].init.type) {
        throw CompileError("state '" + st + "' is updated with " + g.type(v).str() + " but holds " +
                           g.states[s->second].init.type.str());
      }
      g.states[s->second].output = static_cast<int32_t>(g.outputs.size());
      g.outputs.push_back(v);
    }
  }
  return g;
}

}  // namespace chroma

#include "import/importer.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
  const uint8_t* data = nullptr;  // the data blob
  uint64_t data_length = 0;
  // The file's mapping, when the bytes are one (import_graph_file): the weights are views of
  // it (Blob), not copies.
  std::shared_ptr<const void> mapping;
};

// Checks the container (docs/graph_format.md section 1) and parses the JSON. Every rule a
// reader MUST enforce is enforced here, with sizes compared without overflowing.
GraphFile parse_container(const uint8_t* b, size_t size, const std::string& name) {
  auto bad = [&](const std::string& why) { return CompileError("graph file '" + name + "': " + why); };
  if (size < 64) throw bad("truncated header (" + std::to_string(size) + " bytes, the header has 64)");
  if (std::memcmp(b, kMagic, 8) != 0) throw bad("bad magic (not a Chroma graph file)");
  const uint32_t version = read_le<uint32_t>(b + 8);
  if (version != kFormatVersion) {
    throw bad("format version " + std::to_string(version) + " is not supported (this compiler reads version " +
              std::to_string(kFormatVersion) + ")");
  }
  const uint32_t header_size = read_le<uint32_t>(b + 12);
  if (header_size != 64) throw bad("field header_size is " + std::to_string(header_size) + ", must be 64");
  for (int i = 48; i < 64; ++i) {
    if (b[i] != 0) throw bad("reserved header byte " + std::to_string(i) + " is not zero");
  }
  const uint64_t json_off = read_le<uint64_t>(b + 16), json_len = read_le<uint64_t>(b + 24);
  const uint64_t data_off = read_le<uint64_t>(b + 32), data_len = read_le<uint64_t>(b + 40);
  if (json_off < 64) throw bad("field json_offset is " + std::to_string(json_off) + ", must be at least 64");
  if (json_off > size || json_len > size - json_off) {
    throw bad("truncated file: the JSON section (json_offset " + std::to_string(json_off) + ", json_length " +
              std::to_string(json_len) + ") ends past the file's " + std::to_string(size) + " bytes");
  }
  if (data_off % 64 != 0) throw bad("field data_offset " + std::to_string(data_off) + " is not a multiple of 64");
  if (data_off < json_off + json_len) {
    throw bad("field data_offset " + std::to_string(data_off) + " overlaps the JSON section (which ends at " +
              std::to_string(json_off + json_len) + ")");
  }
  if (data_off > size || data_len > size - data_off) {
    throw bad("truncated file: the data section (data_offset " + std::to_string(data_off) + ", data_length " +
              std::to_string(data_len) + ") ends past the file's " + std::to_string(size) + " bytes");
  }
  if (data_off + data_len != size) {
    throw bad(std::to_string(size - data_off - data_len) + " trailing bytes after the data section");
  }
  GraphFile gf;
  try {
    gf.meta = json::parse(b + json_off, b + json_off + json_len);
  } catch (const json::exception& e) {
    throw bad(std::string("malformed JSON: ") + e.what());
  }
  if (!gf.meta.is_object()) throw bad("the JSON section is not an object");
  gf.data = b + data_off;
  gf.data_length = data_len;
  return gf;
}

std::string where(const json& node) {
  std::string s = "node '" + node.value("name", std::string("?")) + "' (" + node.value("target", std::string("?")) + ")";
  const std::string src = node.value("source", std::string());
  if (!src.empty()) s += " at " + src;
  return s;
}

TensorType parse_type(const json& j, const std::string& what) {
  if (!j.is_object()) throw CompileError(what + ": expected an object with 'dtype' and 'shape'");
  TensorType t;
  const std::string dt = j.at("dtype").get<std::string>();
  if (!parse_dtype(dt, &t.dtype)) throw CompileError(what + ": dtype " + dt + " is not supported");
  t.shape = j.at("shape").get<std::vector<int64_t>>();
  check_tensor_size(t, what);
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

CheckedVector<Value> Call::tensors(size_t i, const char* name) const {
  const json* j = get(i, name);
  if (!j || !j->is_array()) fail(std::string("argument '") + name + "' must be a list of tensors");
  std::vector<Value> r;
  for (const json& e : *j) r.push_back(ref(e, name));
  return r;
}

CheckedVector<std::optional<Value>> Call::opt_tensors(size_t i, const char* name) const {
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

Shape Call::ints(size_t i, const char* name) const {
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
    register_aten_scatter(t);
    register_aten_sampling(t);
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
      // A bfloat16 convolution keeps its batch norm: eager rounds the convolution's result to
      // bfloat16 before normalizing it, and the unscaled weights stay bfloat16 values, which
      // the CPU's bfloat16 convolution kernel takes as they are (the batch norm's scale and
      // shift, and the roundings, run on each block of the result as it is stored).
      const json* outs = node.contains("outputs") ? &node["outputs"] : nullptr;
      if (outs && outs->is_array() && !outs->empty() && (*outs)[0].is_object() &&
          (*outs)[0].value("dtype", std::string()) == "bfloat16") {
        continue;
      }
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

// The document's structure that every later step relies on, checked once with a precise
// message: the format and version, the top-level lists, and each input, weight, node and
// output's required fields.
void check_document(const json& m, const std::string& path, std::string& ctx) {
  ctx = "field 'format'";
  if (m.value("format", std::string()) != "chroma.graph") throw CompileError("graph file '" + path + "': not a chroma.graph document");
  ctx = "field 'version'";
  if (m.contains("version") && m["version"] != kFormatVersion) {
    throw CompileError("graph file '" + path + "': JSON field 'version' is " + m["version"].dump() +
                       ", the header says " + std::to_string(kFormatVersion));
  }
  for (const char* key : {"inputs", "weights", "nodes", "outputs"}) {
    ctx = std::string("field '") + key + "'";
    if (!m.contains(key) || !m[key].is_array()) {
      throw CompileError("graph file '" + path + "': field '" + key + "' is missing or not a list");
    }
  }
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) throw CompileError("graph file '" + path + "': " + ctx + ": " + what);
  };
  auto is_str = [](const json& j, const char* k) { return j.contains(k) && j[k].is_string(); };
  for (const char* key : {"inputs", "weights"}) {
    for (size_t i = 0; i < m[key].size(); ++i) {
      ctx = std::string(key) + "[" + std::to_string(i) + "]";
      require(m[key][i].is_object() && is_str(m[key][i], "name"), "expected an object with a string 'name'");
    }
  }
  for (size_t i = 0; i < m["nodes"].size(); ++i) {
    const json& n = m["nodes"][i];
    ctx = "nodes[" + std::to_string(i) + "]";
    require(n.is_object(), "expected an object");
    require(is_str(n, "name") && is_str(n, "target"), "expected string fields 'name' and 'target'");
    ctx = "node '" + n["name"].get<std::string>() + "'";
    require(n.contains("args") && n["args"].is_array(), "field 'args' is missing or not a list");
    require(!n.contains("kwargs") || n["kwargs"].is_object(), "field 'kwargs' is not an object");
    require(n.contains("outputs") && n["outputs"].is_array(), "field 'outputs' is missing or not a list");
    require(!n.contains("source") || n["source"].is_string(), "field 'source' is not a string");
  }
  for (const json& o : m["outputs"]) {
    ctx = "field 'outputs'";
    require(o.is_object() && is_str(o, "ref"), "each output must be a REF ({\"ref\": name})");
  }
}

// Reports every unsupported op at once, before anything is built; ops that cannot be
// compiled by design say why. A batch norm folded into its convolution needs no handler.
void check_supported(const json& m, const HandlerTable& handlers, const std::set<std::string>& folded) {
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
}

// One checked document being built into a graph, step by step in the document's order:
// inputs, weights (constants, or state inputs), nodes, outputs, state updates. `values` maps
// each defined name to its values; `ctx` names the part being read, for error messages.
class DocumentImport {
 public:
  DocumentImport(const GraphFile& gf, const std::string& path, std::string& ctx)
      : gf_(gf), m_(gf.meta), path_(path), ctx_(ctx) {}

  void add_inputs();
  void add_weights();
  void add_nodes(const HandlerTable& handlers, const std::map<std::string, const json*>& folds,
                 const std::set<std::string>& folded);
  void add_outputs();
  void add_state_updates();
  Graph take() { return std::move(g_); }

 private:
  void define(const std::string& name, std::vector<Value> v);
  void add_node(const json& node, const HandlerTable& handlers, const std::map<std::string, const json*>& folds,
                const std::set<std::string>& folded);

  const GraphFile& gf_;
  const json& m_;
  const std::string& path_;
  std::string& ctx_;
  Graph g_;
  Builder b_{g_};
  std::unordered_map<std::string, std::vector<Value>> values_;
  // State (buffers the model updates in place) becomes extra graph inputs after the user's,
  // and their new values extra outputs after the user's (see StateBinding): name -> index in
  // g_.states.
  std::map<std::string, size_t> state_of_;
};

void DocumentImport::define(const std::string& name, std::vector<Value> v) {
  if (!values_.emplace(name, std::move(v)).second) {
    throw CompileError("graph file '" + path_ + "': the name '" + name + "' is defined twice (" + ctx_ + ")");
  }
}

void DocumentImport::add_inputs() {
  for (size_t i = 0; i < m_["inputs"].size(); ++i) {
    const json& in = m_["inputs"][i];
    ctx_ = "inputs[" + std::to_string(i) + "]";
    const std::string name = in.at("name").get<std::string>();
    define(name, {g_.input(name, parse_type(in, "input '" + name + "'"))});
  }
}

void DocumentImport::add_weights() {
  const uint8_t* data = gf_.data;
  for (size_t i = 0; i < m_["weights"].size(); ++i) {
    const json& w = m_["weights"][i];
    ctx_ = "weights[" + std::to_string(i) + "]";
    const std::string name = w.at("name").get<std::string>();
    ConstantData c;
    c.type = parse_type(w, "weight '" + name + "'");
    c.name = w.value("source", name);
    const uint64_t off = w.at("offset").get<uint64_t>(), nb = w.at("nbytes").get<uint64_t>();
    if (off > gf_.data_length || nb > gf_.data_length - off) {
      throw CompileError("graph file '" + path_ + "': weight '" + name + "': offset " + std::to_string(off) + " and nbytes " +
                         std::to_string(nb) + " lie outside the " + std::to_string(gf_.data_length) + "-byte data section");
    }
    if (static_cast<int64_t>(nb) != c.type.nbytes()) {
      throw CompileError("graph file '" + path_ + "': weight '" + name + "': nbytes " + std::to_string(nb) + " but " +
                         c.type.str() + " has " + std::to_string(c.type.nbytes()) + " bytes");
    }
    c.bytes = gf_.mapping ? std::make_shared<const Blob>(gf_.mapping, data + off, static_cast<size_t>(nb))
                          : make_blob(std::vector<uint8_t>(data + off, data + off + nb));
    if (w.value("kind", std::string()) == "state") {
      StateBinding s;
      s.name = c.name;
      s.input = static_cast<int32_t>(g_.inputs.size());
      s.init = c;
      define(name, {g_.input(c.name, c.type)});
      state_of_[s.name] = g_.states.size();
      g_.states.push_back(std::move(s));
      continue;
    }
    define(name, {g_.constant(std::move(c))});
  }
}

void DocumentImport::add_nodes(const HandlerTable& handlers, const std::map<std::string, const json*>& folds,
                               const std::set<std::string>& folded) {
  for (size_t i = 0; i < m_["nodes"].size(); ++i) {
    ctx_ = "nodes[" + std::to_string(i) + "]";
    add_node(m_["nodes"][i], handlers, folds, folded);
  }
  g_.set_origin("", "");
}

// One node through its handler (or, folded into its convolution, as the convolution's
// output), with the handler's errors turned into messages that name the node, and its
// outputs checked against the types the exporter recorded.
void DocumentImport::add_node(const json& node, const HandlerTable& handlers,
                              const std::map<std::string, const json*>& folds, const std::set<std::string>& folded) {
  const std::string name = node.at("name").get<std::string>();
  ctx_ = "node '" + name + "'";
  g_.set_origin(name, node.value("source", std::string()));
  Call call(node, b_, values_);
  std::vector<Value> outs;
  if (auto f = folds.find(name); f != folds.end()) call.set_fused(f->second);
  try {
    if (folded.count(name)) {
      // Folded into its convolution: the normalized value is the convolution's output, the
      // (unused) statistics outputs are zeros of the recorded types.
      outs.push_back(call.tensor(0, "input"));
      for (size_t k = 1; k < node.at("outputs").size(); ++k) {
        const TensorType t = call.out_type(k);
        outs.push_back(b_.full(Scalar::of_int(0), t.dtype, t.shape));
      }
    } else {
      outs = handlers.at(call.target())(call);
    }
  } catch (const CompileError& e) {
    const std::string msg = e.what();
    if (msg.rfind("node '", 0) == 0) throw;
    call.fail(msg);
  } catch (const json::exception& e) {
    // An argument of the wrong JSON type or a missing field.
    call.fail(std::string("malformed arguments: ") + e.what());
  } catch (const std::out_of_range& e) {
    call.fail(std::string("an argument is out of range: ") + e.what());
  } catch (const std::length_error& e) {
    call.fail(std::string("an argument is out of range: ") + e.what());
  } catch (const std::bad_alloc&) {
    call.fail("out of memory building this node (are its sizes sane?)");
  }
  // The exporter recorded each output's type: the decomposition must agree.
  if (outs.size() != node.at("outputs").size()) {
    call.fail("the graph file records " + std::to_string(node.at("outputs").size()) + " outputs, the op has " +
              std::to_string(outs.size()));
  }
  for (size_t k = 0; k < outs.size() && k < node.at("outputs").size(); ++k) {
    if (node.at("outputs")[k].is_null()) continue;  // a Python scalar (item()): kept as a 0-d tensor
    const TensorType want = call.out_type(k);
    if (g_.type(outs[k]) != want) {
      call.fail("internal: lowered output " + std::to_string(k) + " has type " + g_.type(outs[k]).str() +
                ", PyTorch says " + want.str());
    }
  }
  define(name, std::move(outs));
}

void DocumentImport::add_outputs() {
  ctx_ = "field 'outputs'";
  for (const json& o : m_.at("outputs")) {
    const std::string r = o.at("ref").get<std::string>();
    auto it = values_.find(r);
    if (it == values_.end()) throw CompileError("graph output refers to unknown value '" + r + "'");
    g_.outputs.push_back(it->second.at(o.value("index", 0)));
  }
  ctx_ = "field 'output_structure'";
  g_.output_structure = m_.value("output_structure", std::string("single"));
  if (g_.output_structure != "single" && g_.output_structure != "tuple" && g_.output_structure != "list") {
    throw CompileError("graph file '" + path_ + "': field 'output_structure' is '" + g_.output_structure +
                       "', expected 'single', 'tuple' or 'list'");
  }
  if (g_.output_structure == "single" && g_.outputs.size() != 1) {
    throw CompileError("graph file '" + path_ + "': output_structure 'single' with " + std::to_string(g_.outputs.size()) +
                       " outputs");
  }
}

// Each state's new value becomes an extra output after the user's.
void DocumentImport::add_state_updates() {
  ctx_ = "field 'state_updates'";
  if (!m_.contains("state_updates")) return;
  for (const json& u : m_.at("state_updates")) {
    const std::string st = u.at("state").get<std::string>();
    auto s = state_of_.find(st);
    if (s == state_of_.end()) throw CompileError("graph file '" + path_ + "': state update of unknown state '" + st + "'");
    const std::string r = u.at("ref").get<std::string>();
    auto it = values_.find(r);
    if (it == values_.end()) throw CompileError("state update of '" + st + "' refers to unknown value '" + r + "'");
    const Value v = it->second.at(u.value("index", 0));
    if (g_.type(v) != g_.states[s->second].init.type) {
      throw CompileError("state '" + st + "' is updated with " + g_.type(v).str() + " but holds " +
                         g_.states[s->second].init.type.str());
    }
    g_.states[s->second].output = static_cast<int32_t>(g_.outputs.size());
    g_.outputs.push_back(v);
  }
}

// Builds the graph from a checked container. `ctx` names the part being read, for the
// message when the JSON does not have the structure the format specifies.
Graph import_document(const GraphFile& gf, const std::string& path, std::string& ctx) {
  const json& m = gf.meta;
  check_document(m, path, ctx);
  ctx = "the nodes' arguments";
  const HandlerTable& handlers = aten_handlers();

  std::set<std::string> weight_names;
  for (const json& w : m.at("weights")) {
    if (w.value("kind", std::string()) != "state") weight_names.insert(w.at("name").get<std::string>());
  }
  const std::map<std::string, const json*> folds = conv_bn_folds(m, weight_names);
  std::set<std::string> folded;
  for (const auto& [conv, bn] : folds) folded.insert(bn->at("name").get<std::string>());
  check_supported(m, handlers, folded);

  DocumentImport doc(gf, path, ctx);
  doc.add_inputs();
  doc.add_weights();
  doc.add_nodes(handlers, folds, folded);
  doc.add_outputs();
  doc.add_state_updates();
  return doc.take();
}

}  // namespace

namespace {

Graph import_container(const GraphFile& gf, const std::string& name) {
  std::string ctx = "the document";
  try {
    return import_document(gf, name, ctx);
  } catch (const json::exception& e) {
    throw CompileError("graph file '" + name + "': " + ctx + " is malformed: " + e.what());
  } catch (const std::out_of_range& e) {
    throw CompileError("graph file '" + name + "': " + ctx + ": a reference is out of range (" + e.what() + ")");
  } catch (const std::bad_alloc&) {
    throw CompileError("graph file '" + name + "': out of memory reading " + ctx);
  }
}

// Files at least this large are mapped rather than read: their weights stay file pages.
constexpr uint64_t kMapBytes = uint64_t{1} << 20;

// The whole file mapped read-only (nullptr when it cannot be: the caller reads it instead).
std::shared_ptr<const void> map_file(const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  return std::shared_ptr<const void>(p, [size](const void* q) { ::munmap(const_cast<void*>(q), static_cast<size_t>(size)); });
}

}  // namespace

Graph import_graph_bytes(const uint8_t* bytes, size_t size, const std::string& name) {
  return import_container(parse_container(bytes, size, name), name);
}

Graph import_graph_file(const std::string& path) {
  // Only regular files: a FIFO or a device would block or never end.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) throw CompileError("cannot open graph file '" + path + "'");
  if (!std::filesystem::is_regular_file(st)) throw CompileError("graph file '" + path + "' is not a regular file");
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (!ec && size >= kMapBytes) {
    if (std::shared_ptr<const void> mapping = map_file(path, size)) {
      GraphFile gf = parse_container(static_cast<const uint8_t*>(mapping.get()), static_cast<size_t>(size), path);
      gf.mapping = std::move(mapping);
      return import_container(gf, path);
    }
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CompileError("cannot open graph file '" + path + "'");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return import_graph_bytes(bytes.data(), bytes.size(), path);
}

}  // namespace chroma

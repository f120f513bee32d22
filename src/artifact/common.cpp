#include "artifact/common.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "artifact/build.h"
#include "chroma/detail/sha256.h"
#include "quant/quant.h"

namespace chroma {
namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t WeightsLayout::add(const ConstantData& c, const std::string& name) {
  const std::vector<uint8_t> converted = storage_ ? storage_(c, name) : std::vector<uint8_t>{};
  const uint8_t* data = storage_ ? converted.data() : c.data();
  const auto nb = storage_ ? converted.size() : static_cast<size_t>(c.type.nbytes());
  const std::string key = chroma::detail::sha256_hex(data, nb) + c.type.str();
  int64_t off;
  auto d = by_digest_.find(key);
  if (d != by_digest_.end()) {
    off = d->second;
  } else {
    off = (size() + align_ - 1) / align_ * align_;
    if (shards.empty()) shards.emplace_back(0, 0);
    // A tensor larger than the limit gets a shard of its own (the package then requires a
    // larger binding; the runtimes name the limit when the device lacks it); the next
    // tensor starts a new shard.
    if (shard_limit_ > 0 && off + static_cast<int64_t>(nb) - shards.back().first > shard_limit_ && shards.back().second > shards.back().first) {
      off = (off + shard_align_ - 1) / shard_align_ * shard_align_;
      shards.emplace_back(off, off);  // a new shard starts here
    }
    append(off, data, nb);
    shards.back().second = size();
    by_digest_[key] = off;
  }
  tensors.push_back({{"name", name}, {"dtype", dtype_name(c.type.dtype)}, {"shape", c.type.shape}, {"offset", off}, {"nbytes", nb}});
  return off;
}

int WeightsLayout::shard_of(int64_t offset) const {
  for (size_t i = shards.size(); i-- > 0;) {
    if (offset >= shards[i].first) return static_cast<int>(i);
  }
  return 0;
}

void WeightsLayout::add_program(Program& p) {
  std::map<int32_t, int64_t> slot_offset;
  std::vector<bool> read(p.buffers.size(), false);
  auto mark = [&](auto&& self, const Expr& e) -> void {
    if (e.kind == Expr::kLoad) read[static_cast<size_t>(e.buffer)] = true;
    for (const Expr& c : e.children) self(self, c);
  };
  for (const Kernel& k : p.kernels) {
    for (const Expr& e : k.inputs) mark(mark, e);
  }
  for (Buffer& b : p.buffers) {
    if (b.region != Region::kConstant || !read[static_cast<size_t>(&b - p.buffers.data())]) continue;
    auto it = slot_offset.find(b.slot);
    if (it != slot_offset.end()) {
      b.offset = it->second;
      continue;
    }
    const ConstantData& c = p.constants[static_cast<size_t>(b.slot)];
    b.offset = slot_offset[b.slot] = add(c, c.name.empty() ? "folded_" + std::to_string(b.slot) : c.name);
  }
}

void WeightsLayout::write_to(const std::string& path) {
  if (!bytes.empty()) throw CompileError("internal: WeightsLayout::write_to after tensors were added");
  path_ = path;
  file_ = std::make_shared<std::ofstream>(path, std::ios::binary | std::ios::trunc);
  if (!*file_) throw CompileError("cannot write '" + path + "'");
}

// Bytes [at, at + n) of the blob, zeros before them from its current end.
void WeightsLayout::append(int64_t at, const uint8_t* data, size_t n) {
  if (!file_) {
    bytes.resize(static_cast<size_t>(at), 0);
    bytes.insert(bytes.end(), data, data + n);
    return;
  }
  const std::vector<char> zeros(static_cast<size_t>(at - file_size_), 0);
  file_->write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  file_->write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!*file_) throw CompileError("writing '" + path_ + "' failed (disk full?)");
  file_size_ = at + static_cast<int64_t>(n);
}

void WeightsLayout::finish() {
  const int64_t end = (size() + align_ - 1) / align_ * align_;
  append(end, nullptr, 0);
  if (shards.empty()) shards.emplace_back(0, 0);
  shards.back().second = size();
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!file_) {
    digest = chroma::detail::sha256_tree_hex(bytes.data(), bytes.size(), threads);
    return;
  }
  file_->close();
  if (!*file_) throw CompileError("writing '" + path_ + "' failed (disk full?)");
  // The digest from the file's pages, mapped (the blob was never in memory).
  if (file_size_ == 0) {
    digest = chroma::detail::sha256_tree_hex(nullptr, 0, threads);
    return;
  }
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  void* p = fd < 0 ? MAP_FAILED : ::mmap(nullptr, static_cast<size_t>(file_size_), PROT_READ, MAP_PRIVATE, fd, 0);
  if (fd >= 0) ::close(fd);
  if (p == MAP_FAILED) throw CompileError("cannot read back '" + path_ + "' for its digest");
  digest = chroma::detail::sha256_tree_hex(p, static_cast<size_t>(file_size_), threads);
  ::munmap(p, static_cast<size_t>(file_size_));
}

StateLayout layout_state(std::vector<CompiledEntry>& entries, WeightsLayout& wl, int64_t align,
                         const std::function<int64_t(const TensorType&)>& storage_bytes) {
  StateLayout sl;
  std::map<std::string, size_t> index;
  std::vector<TensorType> types;
  for (CompiledEntry& e : entries) {
    for (const StateBinding& st : e.program.states) {
      auto it = index.find(st.name);
      if (it != index.end()) {
        if (types[it->second] != st.init.type) {
          throw CompileError("state '" + st.name + "' is " + st.init.type.str() + " in entry '" + e.name +
                             "' but has another type in an earlier entry");
        }
        continue;
      }
      StateLayout::Tensor t;
      t.name = st.name;
      t.nbytes = storage_bytes(st.init.type);
      t.offset = (sl.bytes + align - 1) / align * align;
      sl.bytes = t.offset + t.nbytes;
      index[st.name] = sl.tensors.size();
      sl.tensors.push_back(t);
      types.push_back(st.init.type);
      sl.manifest.push_back({{"name", st.name}, {"dtype", dtype_name(st.init.type.dtype)}, {"shape", st.init.type.shape},
                             {"offset", t.offset}, {"bytes", t.nbytes}});
    }
  }
  for (CompiledEntry& e : entries) {
    for (Buffer& b : e.program.buffers) {
      if (b.region == Region::kState) b.offset = sl.tensors[index.at(e.program.states[static_cast<size_t>(b.slot)].name)].offset;
    }
    wl.add_program(e.program);
  }
  // Initial values of the state live in the weights.
  std::vector<bool> have_init(sl.tensors.size(), false);
  for (CompiledEntry& e : entries) {
    for (const StateBinding& st : e.program.states) {
      const size_t i = index.at(st.name);
      if (have_init[i]) continue;
      have_init[i] = true;
      sl.tensors[i].init_offset = wl.add(st.init, "state:" + st.name);
      sl.manifest[i]["init_offset"] = sl.tensors[i].init_offset;
    }
  }
  sl.bytes = (sl.bytes + align - 1) / align * align;
  return sl;
}

json describe_weights(const std::vector<CompiledEntry>& entries, const std::string& spec) {
  const quant::Policy pol = quant::parse_policy(spec);
  json decisions = json::array();
  int64_t f32 = 0, stored = 0;
  for (const CompiledEntry& e : entries) {
    for (const quant::Decision& d : e.program.weight_decisions) {
      decisions.push_back({{"entry", e.name}, {"name", d.name}, {"role", d.role}, {"shape", d.shape}, {"matrices", d.matrices},
                           {"format", quant::format_name(d.format)}, {"reason", d.reason}, {"bytes_fp32", d.bytes_f32},
                           {"bytes", d.bytes}});
      f32 += d.bytes_f32;
      stored += d.bytes;
    }
  }
  return {{"spec", pol.spec.empty() ? "fp32" : pol.spec},
          {"default", quant::format_name(pol.fallback)},
          {"activations", quant::activations_name(pol.activations)},
          {"attention", pol.attention_bf16 ? "bf16" : "fp32"},
          {"group_size", quant::kGroup},
          {"scale_type", "float16"},
          {"product_weights_bytes_fp32", f32},
          {"product_weights_bytes", stored},
          {"decisions", decisions}};
}

json describe_entry(const CompiledEntry& e, int64_t weight_bytes, int64_t state_bytes) {
  const Program& p = e.program;
  json m;
  m["name"] = e.name;
  auto io = [&](const std::vector<int32_t>& ids, bool inputs) {
    json a = json::array();
    for (size_t i = 0; i < ids.size(); ++i) {
      const Buffer& b = p.buffers[static_cast<size_t>(ids[i])];
      a.push_back({{"name", inputs ? p.input_names[i] : "output" + std::to_string(i)},
                   {"dtype", dtype_name(b.type.dtype)},
                   {"shape", b.type.shape}});
    }
    return a;
  };
  m["inputs"] = io(p.inputs, true);
  m["outputs"] = io(p.outputs, false);
  m["output_structure"] = p.output_structure;
  json used = json::array();
  for (const StateBinding& st : p.states) used.push_back({{"name", st.name}, {"updated", st.output >= 0}});
  m["state"] = used;
  json bufs = json::array();
  int64_t in_bytes = 0, out_bytes = 0;
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const Buffer& b = p.buffers[i];
    if (b.region == Region::kInput) in_bytes += b.type.nbytes();
    if (b.region == Region::kOutput) out_bytes += b.type.nbytes();
    if (b.region != Region::kArena) continue;
    bufs.push_back({{"id", i}, {"name", b.name}, {"dtype", dtype_name(b.type.dtype)}, {"shape", b.type.shape},
                    {"offset", b.offset}, {"bytes", b.type.nbytes()}, {"first", b.first}, {"last", b.last}});
  }
  m["arena"] = {{"bytes", p.arena_bytes}, {"lower_bound", p.arena_lower_bound}, {"temporaries_bytes", p.temporaries_bytes},
                {"buffers", bufs}, {"plan", p.plan_description}};
  json ks = json::array();
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const Kernel& k = p.kernels[i];
    ks.push_back({{"index", i}, {"kind", kernel_kind(k.kind)}, {"label", k.label}, {"node", k.name}, {"source", k.source}});
    // A bfloat16 model's convolution on oneDNN's bfloat16 kernel (where the CPU has AVX512-BF16).
    if (k.kind == Kernel::kConv && k.weight_format() == quant::Format::kBF16) ks.back()["precision"] = "bfloat16";
  }
  m["kernels"] = ks;
  m["stats"] = {{"kernels", p.kernels.size()},
                {"fused_expressions", p.fused_expressions},
                {"folded_constants", e.graph.folded_constants},
                {"ir_nodes_imported", e.imported_nodes},
                {"ir_nodes_optimized", e.graph.size()},
                {"arena_bytes", p.arena_bytes},
                {"temporaries_bytes", p.temporaries_bytes},
                {"weight_bytes", weight_bytes},
                {"state_bytes", state_bytes},
                {"input_bytes", in_bytes},
                {"output_bytes", out_bytes}};
  return m;
}

void write_file(const std::string& path, const void* data, size_t n) {
  const fs::path p(path);
  const fs::path tmp = p.string() + unique_suffix();
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    if (!f) throw CompileError("cannot write " + tmp.string());
  }
  fs::rename(tmp, p);
}

std::string file_sha256(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> buf(1 << 20);
  chroma::detail::Sha256 h;
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(f.gcount()));
  }
  return h.hex_digest();
}

}  // namespace chroma

namespace chroma {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

PhaseTimer::PhaseTimer() : start_(now_s()), last_(start_) {}

void PhaseTimer::lap(const char* name) {
  const double t = now_s(), sec = t - last_;
  last_ = t;
  for (auto& [n, v] : phases_) {
    if (n == name) {
      v += sec;
      return;
    }
  }
  phases_.emplace_back(name, sec);
}

double PhaseTimer::total() const { return now_s() - start_; }

nlohmann::json PhaseTimer::json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [n, v] : phases_) j[n] = v;
  return j;
}

}  // namespace chroma

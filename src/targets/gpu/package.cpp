// The GPU targets' package writer (GpuTarget::write): kernels from the GPU generator in the
// target's dialect, the schedule that replays them, the memory plan, weights shards and golden
// data in one package file (docs/webgpu_package.md) beside the artifact directory, plus the
// directory's manifest.json and whatever the target adds (write_native).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "artifact/build.h"
#include "targets/gpu/gpu_target.h"
#include "chroma/chroma.h"
#include "chroma/detail/sha256.h"
#include "chroma/package_format.h"
#include "codegen/gpu/elementwise.h"
#include "codegen/gpu/gpu_codegen.h"

namespace chroma {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int64_t kAlign = package_format::kAlignment;  // minStorageBufferOffsetAlignment, minUniformBufferOffsetAlignment
constexpr int64_t kShardLimit = package_format::default_limit("maxStorageBufferBindingSize");
constexpr int kFormatVersion = static_cast<int>(package_format::kFormatVersion);

int64_t align_up(int64_t v, int64_t a = kAlign) { return (v + a - 1) / a * a; }

void check_gpu_dtype(DType t, const std::string& what) {
  if (t == DType::kF64)
    throw CompileError(what + " is float64, which no GPU target stores (their kernels compute in 32-bit types): use float32");
}

// A constant as the device stores it (docs/webgpu_package.md "Storage"): 32-bit types as they
// are, int64 narrowed to 32 bits when every value fits, 8- and 16-bit types packed
// little-endian, padded to whole words.
std::vector<uint8_t> to_device(const ConstantData& c, const std::string& name) {
  check_gpu_dtype(c.type.dtype, "weight '" + name + "'");
  const int64_t n = c.type.numel();
  std::vector<uint8_t> out(static_cast<size_t>(device_storage_bytes(c.type.dtype, n)), 0);
  const uint8_t* src = c.data();
  if (c.type.dtype != DType::kI64) {  // already in its device form (little-endian host)
    std::memcpy(out.data(), src, static_cast<size_t>(c.type.nbytes()));
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    int64_t v;
    std::memcpy(&v, src + 8 * i, 8);
    v = gpu::narrow_int64(v);
    if (v < INT32_MIN || v > INT32_MAX) {
      throw CompileError("weight '" + name + "' (int64) holds " + std::to_string(v) + " at element " + std::to_string(i) +
                         ", which does not fit in the GPU's 32-bit integers");
    }
    const auto w = static_cast<int32_t>(v);
    std::memcpy(out.data() + 4 * i, &w, 4);
  }
  return out;
}

struct GoldenTensor {
  std::string name;
  std::string dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
  json generate;      // an input generated at load from a seed (no bytes)
  int64_t stride = 1;  // an output stored every stride-th element
};

struct Golden {
  std::vector<GoldenTensor> inputs, outputs;
  double atol = 0, rtol = 0;
  // int64 example values beyond int32: the device computes int64 in 32-bit words, so neither the
  // self-check nor the program's result can hold them (an UnsupportedError once the ops pass).
  std::vector<Refusal> refusals;
};

// The first int64 value of `gt` beyond int32, as a refusal naming the example tensor.
void check_int32(const GoldenTensor& gt, bool input, std::vector<Refusal>* out) {
  if (gt.dtype != "int64") return;
  for (size_t i = 0; i + 8 <= gt.bytes.size(); i += 8) {
    int64_t v;
    std::memcpy(&v, gt.bytes.data() + i, 8);
    if (v < INT32_MIN || v > INT32_MAX) {
      out->push_back({std::string("example ") + (input ? "input '" : "output '") + gt.name + "'", "", "",
                      "int64 value " + std::to_string(v) + " at element " + std::to_string(i / 8 * gt.stride) +
                          " does not fit in int32, the words GPU targets store and compute int64 tensors in: give "
                          "example inputs in the range the program will be called with, or compile for the CPU"});
      return;
    }
  }
}

Golden read_golden(const std::string& path) {
  Golden g;
  if (path.empty()) return g;
  std::ifstream f(path);
  if (!f) throw CompileError("cannot read the golden data description " + path);
  const json j = json::parse(f);
  auto read = [&](const json& list, std::vector<GoldenTensor>* out) {
    for (const json& t : list) {
      GoldenTensor gt;
      gt.name = t.at("name").get<std::string>();
      gt.dtype = t.at("dtype").get<std::string>();
      gt.shape = t.at("shape").get<std::vector<int64_t>>();
      if (t.contains("generate")) {
        gt.generate = t.at("generate");
        out->push_back(std::move(gt));
        continue;
      }
      gt.stride = t.value("stride", int64_t{1});
      std::ifstream b(t.at("file").get<std::string>(), std::ios::binary);
      gt.bytes.assign(std::istreambuf_iterator<char>(b), std::istreambuf_iterator<char>());
      check_int32(gt, out == &g.inputs, &g.refusals);
      out->push_back(std::move(gt));
    }
  };
  read(j.at("inputs"), &g.inputs);
  read(j.at("outputs"), &g.outputs);
  g.atol = j.at("tolerance").at("atol").get<double>();
  g.rtol = j.at("tolerance").at("rtol").get<double>();
  return g;
}

// The manifest's name for how a tensor of `t` is stored on the device.
std::string storage_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBool:
    case DType::kU8: return "u8";
    case DType::kI8: return "i8";
    case DType::kI16: return "i16";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    default: return "i32";
  }
}

// ---- the writer's steps (GpuTarget::write) -----------------------------------------------

// An entry point's arena layout: the status block, its inputs, its outputs, then its planned
// temporaries (entries run one at a time, so they share one arena buffer); the inputs' and
// outputs' manifest descriptions.
struct EntryArena {
  std::vector<int64_t> input_at, output_at;
  int64_t temps_at = 0;
  json inputs = json::array(), outputs = json::array();
};

EntryArena arena_layout(const Program& ep) {
  EntryArena a;
  a.input_at.resize(ep.inputs.size());
  a.output_at.resize(ep.outputs.size());
  int64_t at = kAlign;
  auto io = [&](const std::vector<int32_t>& ids, std::vector<int64_t>* where, json* list, bool is_input) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const Buffer& b = ep.buffers[static_cast<size_t>(ids[i])];
      check_gpu_dtype(b.type.dtype, is_input ? "input '" + ep.input_names[i] + "'" : "output " + std::to_string(i));
      (*where)[i] = at;
      const int64_t bytes = device_storage_bytes(b.type.dtype, b.type.numel());
      list->push_back({{"name", is_input ? ep.input_names[i] : "output" + std::to_string(i)},
                       {"dtype", dtype_name(b.type.dtype)}, {"shape", b.type.shape}, {"storage", storage_name(b.type.dtype)},
                       {"offset", at}, {"bytes", bytes}});
      at = align_up(at + std::max<int64_t>(bytes, 4));
    }
  };
  io(ep.inputs, &a.input_at, &a.inputs, true);
  io(ep.outputs, &a.output_at, &a.outputs, false);
  a.temps_at = at;
  // Temporaries were planned in the device's storage (GpuTarget::lower_options, gpu_target.cpp).
  for (const Buffer& b : ep.buffers) {
    if (b.region == Region::kArena) check_gpu_dtype(b.type.dtype, "temporary '" + b.name + "'");
  }
  return a;
}

// Where buffer `b` of an entry lies on the device: its arena layout, the state buffer, or a
// weights shard.
gpu::Placement placement(const Buffer& b, const EntryArena& a, const WeightsLayout& wl) {
  gpu::Placement pl;
  switch (b.region) {
    case Region::kInput: pl.word = a.input_at[static_cast<size_t>(b.slot)] / 4; break;
    case Region::kOutput: pl.word = a.output_at[static_cast<size_t>(b.slot)] / 4; break;
    case Region::kArena: pl.word = (a.temps_at + b.offset) / 4; break;
    case Region::kState:
      pl.where = gpu::Placement::kState;
      pl.word = b.offset / 4;
      break;
    case Region::kConstant: {
      pl.where = gpu::Placement::kWeights;
      pl.shard = wl.shard_of(b.offset);
      pl.word = (b.offset - wl.shards[static_cast<size_t>(pl.shard)].first) / 4;
      break;
    }
  }
  return pl;
}

// A dispatch's storage slots as the manifest's bindings (slot s is binding s + 1).
json bindings_of(const gpu::Dispatch& d) {
  json bindings = json::array();
  for (size_t si = 0; si < d.slots.size(); ++si) {
    json bnd = {{"binding", si + 1}};
    switch (d.slots[si].where) {
      case gpu::Placement::kArena: bnd["buffer"] = "arena"; break;
      case gpu::Placement::kState: bnd["buffer"] = "state"; break;
      case gpu::Placement::kWeights:
        bnd["buffer"] = "weights";
        bnd["shard"] = d.slots[si].shard;
        break;
    }
    bindings.push_back(bnd);
  }
  return bindings;
}

// An entry's schedule as the manifest's dispatches: each generated dispatch with its module
// renumbered by `remap` (the package's modules) and its params appended to `params`; a
// library product as its call.
json dispatch_list(std::vector<gpu::Dispatch>& dispatches, const std::vector<int>& remap, std::vector<uint8_t>* params) {
  json edisp = json::array();
  for (gpu::Dispatch& d : dispatches) {
    if (d.library) {  // a float32 product for the platform's BLAS (docs/webgpu_package.md "Library dispatches")
      auto operand = [](const gpu::LibraryGemm::Operand& o) {
        return json{{"word", o.word}, {"batch_stride", o.batch_stride}, {"row_stride", o.row_stride}, {"col_stride", o.col_stride}};
      };
      const gpu::LibraryGemm& gm = d.gemm;
      edisp.push_back({{"library", {{"op", "sgemm"}, {"batch", gm.batch}, {"m", gm.m}, {"n", gm.n}, {"k", gm.k},
                                    {"a", operand(gm.a)}, {"b", operand(gm.b)}, {"c", operand(gm.c)}}},
                       {"bindings", bindings_of(d)}, {"label", d.label}, {"node", d.node}, {"source", d.source}});
      continue;
    }
    d.module = remap[static_cast<size_t>(d.module)];
    const int64_t off = align_up(static_cast<int64_t>(params->size()));
    params->resize(static_cast<size_t>(off), 0);
    const auto* pb = reinterpret_cast<const uint8_t*>(d.params.data());
    params->insert(params->end(), pb, pb + 4 * d.params.size());
    edisp.push_back({{"kernel", d.module}, {"grid", {d.grid_x, d.grid_y, 1}}, {"params", off}, {"bindings", bindings_of(d)},
                     {"label", d.label}, {"node", d.node}, {"source", d.source}});
  }
  return edisp;
}

// Every entry point's kernels and schedule. Each entry has its own arena layout and schedule;
// kernels are shared, each distinct text once across entries.
struct EntriesCode {
  gpu::Generated gen;  // every entry's modules; dispatches: entry 0's (the top-level schedule)
  std::vector<uint8_t> params;
  json entry_list = json::array();
  json inputs, outputs, dispatches;  // entry 0's
  int64_t arena_bytes = kAlign;
};

EntriesCode generate_entries(std::vector<CompiledEntry>& entries, const WeightsLayout& wl, const gpu::Capabilities& caps,
                             const gpu::Dialect& dialect) {
  EntriesCode c;
  gpu::Generated& gen = c.gen;
  std::map<std::string, int> module_of;
  for (size_t ei = 0; ei < entries.size(); ++ei) {
    Program& ep = entries[ei].program;
    const EntryArena a = arena_layout(ep);
    c.arena_bytes = std::max(c.arena_bytes, align_up(a.temps_at + ep.arena_bytes));
    auto place = [&](int32_t id) { return placement(ep.buffers[static_cast<size_t>(id)], a, wl); };
    gpu::Generated g = gpu::generate(ep, place, caps, dialect);
    std::vector<int> remap(g.modules.size());
    for (size_t m = 0; m < g.modules.size(); ++m) {
      const std::string key = g.modules[m].code + '\x01' + g.modules[m].code_subgroups;
      auto [it, added] = module_of.emplace(key, static_cast<int>(gen.modules.size()));
      if (added) gen.modules.push_back(std::move(g.modules[m]));
      remap[m] = it->second;
    }
    gen.max_slots = std::max(gen.max_slots, g.max_slots);
    gen.max_workgroup_size = std::max(gen.max_workgroup_size, g.max_workgroup_size);
    gen.max_shared_bytes = std::max(gen.max_shared_bytes, g.max_shared_bytes);
    gen.max_grid = std::max(gen.max_grid, g.max_grid);
    const json edisp = dispatch_list(g.dispatches, remap, &c.params);
    if (ei == 0) {
      c.inputs = a.inputs;
      c.outputs = a.outputs;
      c.dispatches = edisp;
      gen.dispatches = std::move(g.dispatches);
    }
    c.entry_list.push_back({{"name", entries[ei].name}, {"inputs", a.inputs}, {"outputs", a.outputs},
                            {"output_structure", ep.output_structure}, {"dispatches", edisp}});
  }
  return c;
}

// The package's payload: params, weights shards, state initial values and golden data, each
// section 256-byte aligned; and the manifest's descriptions of them.
struct Payload {
  std::vector<uint8_t> bytes;
  int64_t params_at = 0, largest_shard = 0;
  json shards = json::array();
  json tensors = json::array();  // shard-relative, in the device's storage
  json state, golden;

  int64_t section(const void* data, size_t n) {
    const int64_t off = align_up(static_cast<int64_t>(bytes.size()));
    bytes.resize(static_cast<size_t>(off), 0);
    const auto* b = static_cast<const uint8_t*>(data);
    bytes.insert(bytes.end(), b, b + n);
    return off;
  }
};

// `params` is padded to whole sections; golden data `target` cannot hold is refused.
Payload build_payload(std::vector<uint8_t>& params, const WeightsLayout& wl, const StateLayout& sl,
                      const std::string& golden_path, const std::string& target) {
  Payload pl;
  params.resize(static_cast<size_t>(align_up(std::max<int64_t>(static_cast<int64_t>(params.size()), 16))), 0);
  pl.params_at = pl.section(params.data(), params.size());
  const int64_t weights_at = align_up(static_cast<int64_t>(pl.bytes.size()));
  pl.section(wl.bytes.data(), wl.bytes.size());
  for (const auto& [s0, s1] : wl.shards) {
    pl.shards.push_back({{"offset", weights_at + s0}, {"bytes", std::max<int64_t>(s1 - s0, 4)}});
    pl.largest_shard = std::max(pl.largest_shard, s1 - s0);
  }
  for (const json& t : wl.tensors) {
    const int64_t off = t.at("offset").get<int64_t>();
    const int shard = wl.shard_of(off);
    pl.tensors.push_back({{"name", t.at("name")}, {"dtype", t.at("dtype")}, {"shape", t.at("shape")}, {"shard", shard},
                          {"offset", off - wl.shards[static_cast<size_t>(shard)].first}, {"bytes", t.at("nbytes")}});
  }
  pl.state = {{"bytes", sl.bytes}, {"tensors", json::array()}};
  for (const StateLayout::Tensor& t : sl.tensors) {
    // Each initial value in a payload section of its own (256-byte aligned, as every section).
    const int64_t init_at = pl.section(wl.bytes.data() + t.init_offset, static_cast<size_t>(t.nbytes));
    pl.state["tensors"].push_back({{"name", t.name}, {"offset", t.offset}, {"bytes", t.nbytes}, {"init", init_at}});
  }
  const Golden golden = read_golden(golden_path);
  if (!golden.refusals.empty()) throw UnsupportedError(target, golden.refusals);
  pl.golden = {{"inputs", json::array()}, {"outputs", json::array()}, {"tolerance", {{"atol", golden.atol}, {"rtol", golden.rtol}}}};
  for (const auto* list : {&golden.inputs, &golden.outputs}) {
    for (const GoldenTensor& t : *list) {
      json entry = {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}};
      if (!t.generate.is_null()) {
        entry["generate"] = t.generate;
      } else {
        entry["offset"] = pl.section(t.bytes.data(), t.bytes.size());
        entry["bytes"] = t.bytes.size();
        if (t.stride != 1) entry["stride"] = t.stride;
      }
      pl.golden[list == &golden.inputs ? "inputs" : "outputs"].push_back(std::move(entry));
    }
  }
  pl.bytes.resize(static_cast<size_t>(align_up(static_cast<int64_t>(pl.bytes.size()))), 0);
  return pl;
}

// The manifest's kernels: each module's code (and its subgroup variant) with its bindings;
// `max_params` gets the largest params block (at least 16 bytes).
json kernel_list(const gpu::Generated& gen, int64_t* max_params) {
  json kernels = json::array();
  *max_params = 16;
  for (const gpu::Module& m : gen.modules) {
    json b = json::array();
    const int64_t pbytes = align_up(4 * m.params, 16);
    *max_params = std::max(*max_params, pbytes);
    b.push_back({{"binding", 0}, {"type", "uniform"}, {"bytes", pbytes}});
    for (size_t s = 0; s < m.slot_writable.size(); ++s) {
      b.push_back({{"binding", s + 1}, {"type", m.slot_writable[s] ? "storage" : "read-only-storage"}});
    }
    json kernel = {{"name", m.name}, {"code", m.code}, {"entry", "main"}, {"workgroup_size", {m.workgroup_size, 1, 1}},
                   {"bindings", b}, {"features", json::array()}};
    if (!m.code_subgroups.empty()) {
      kernel["variants"] = json::array({{{"features", {"subgroups"}}, {"code", m.code_subgroups}}});
    }
    kernels.push_back(std::move(kernel));
  }
  return kernels;
}

// Limits the package needs, never below WebGPU's defaults (a device is requested with them);
// `binding` is the largest buffer a kernel binds.
json package_limits(const gpu::Generated& gen, int64_t binding, int64_t max_params) {
  return {
      {"maxStorageBuffersPerShaderStage", std::max(gen.max_slots, 8)},
      {"maxStorageBufferBindingSize", std::max<int64_t>(binding, package_format::default_limit("maxStorageBufferBindingSize"))},
      {"maxBufferSize", std::max<int64_t>(binding, package_format::default_limit("maxBufferSize"))},
      {"maxComputeWorkgroupStorageSize",
       std::max<int64_t>(gen.max_shared_bytes, package_format::default_limit("maxComputeWorkgroupStorageSize"))},
      {"maxComputeInvocationsPerWorkgroup",
       std::max<int64_t>(gen.max_workgroup_size, package_format::default_limit("maxComputeInvocationsPerWorkgroup"))},
      {"maxComputeWorkgroupSizeX", std::max<int64_t>(gen.max_workgroup_size, package_format::default_limit("maxComputeWorkgroupSizeX"))},
      {"maxComputeWorkgroupsPerDimension",
       std::max<int64_t>(gen.max_grid, package_format::default_limit("maxComputeWorkgroupsPerDimension"))},
      {"maxUniformBufferBindingSize", std::max<int64_t>(max_params, package_format::default_limit("maxUniformBufferBindingSize"))},
      {"maxBindingsPerBindGroup", std::max<int64_t>(gen.max_slots + 1, package_format::default_limit("maxBindingsPerBindGroup"))},
  };
}

// The package file: header, manifest `m` and payload. The header's digest covers the manifest
// and the payload; the manifest repeats it as content_hash, so it is computed with 64 ASCII
// '0' in that place, then filled in. Returns the file; `digest_hex` gets the digest.
std::vector<uint8_t> pack_package(json& m, const std::vector<uint8_t>& payload, std::string* digest_hex) {
  auto pack = [&](const std::string& manifest_text, std::vector<uint8_t>* file) {
    const int64_t manifest_at = package_format::kHeaderSize;
    const int64_t payload_at = align_up(manifest_at + static_cast<int64_t>(manifest_text.size()));
    file->assign(static_cast<size_t>(payload_at), 0);
    std::memcpy(file->data() + manifest_at, manifest_text.data(), manifest_text.size());
    file->insert(file->end(), payload.begin(), payload.end());
    std::memcpy(file->data(), package_format::kMagic, 8);
    const uint32_t version = kFormatVersion, header = package_format::kHeaderSize;
    const uint64_t mo = static_cast<uint64_t>(manifest_at), ms = manifest_text.size(), po = static_cast<uint64_t>(payload_at),
                   ps = payload.size();
    std::memcpy(file->data() + 8, &version, 4);
    std::memcpy(file->data() + 12, &header, 4);
    std::memcpy(file->data() + 16, &mo, 8);
    std::memcpy(file->data() + 24, &ms, 8);
    std::memcpy(file->data() + 32, &po, 8);
    std::memcpy(file->data() + 40, &ps, 8);
  };
  m["content_hash"] = std::string(64, '0');
  const std::string manifest_text = m.dump();
  std::vector<uint8_t> file;
  pack(manifest_text, &file);
  constexpr size_t kHeader = package_format::kHeaderSize;
  *digest_hex = chroma::detail::sha256_hex(file.data() + kHeader, file.size() - kHeader);
  const size_t hash_at = manifest_text.find("\"content_hash\":\"" + std::string(64, '0') + "\"");
  std::memcpy(file.data() + kHeader + hash_at + 16, digest_hex->data(), 64);
  for (size_t i = 0; i < 32; ++i) file[48 + i] = static_cast<uint8_t>(std::stoi(digest_hex->substr(2 * i, 2), nullptr, 16));
  return file;
}

}  // namespace

// The shared writer's steps: the weights and state layout, every entry's kernels and
// schedule (generate_entries), the payload (build_payload), the manifest and the package file
// (pack_package), then the artifact directory's manifest and the target's native part.
std::string GpuTarget::write(std::vector<CompiledEntry>& entries, const std::string& out_dir, const CompileOptions& opts,
                             PhaseTimer& timer) const {
  if (entries.size() > max_entries()) throw CompileError(entries_refusal(entries.size()));
  CompiledEntry& e = entries[0];  // the package's default entry (its top-level fields)
  Program& p = e.program;

  // Weights and state as the device stores them, shards within the default binding limit.
  // Kernels address a tensor by its offset in its shard, so tensors need only word alignment;
  // shards start on 256 bytes (payload sections).
  WeightsLayout wl(4, kShardLimit, to_device, kAlign);
  const StateLayout sl = layout_state(entries, wl, kAlign, [](const TensorType& t) {
    check_gpu_dtype(t.dtype, "state tensor");
    return device_storage_bytes(t.dtype, t.numel());
  });
  wl.finish();
  const int64_t weight_bytes = static_cast<int64_t>(wl.bytes.size());  // the tensors' words, without padding
  wl.bytes.resize(static_cast<size_t>(align_up(static_cast<int64_t>(wl.bytes.size()))), 0);
  wl.shards.back().second = static_cast<int64_t>(wl.bytes.size());
  timer.lap("weights");

  // The device the kernels are generated for: the target's capability record.
  gpu::Capabilities caps = capabilities();
  if (const char* env = std::getenv("CHROMA_GPU_SPLIT_K"); env && std::string(env) == "off") caps.split_k = false;
  EntriesCode code = generate_entries(entries, wl, caps, dialect());
  const gpu::Generated& gen = code.gen;
  const int64_t arena_bytes = code.arena_bytes;
  timer.lap("codegen");

  const Payload payload = build_payload(code.params, wl, sl, opts.golden_path, name());
  int64_t max_params = 16;
  const json kernels = kernel_list(gen, &max_params);
  const json limits = package_limits(gen, std::max({arena_bytes, sl.bytes, payload.largest_shard}), max_params);
  const int cpu_kernels = static_cast<int>(lower(e.graph, LowerOptions{}).kernels.size());
  auto io_bytes = [&](const std::vector<int32_t>& ids) {
    int64_t n = 0;
    for (int32_t id : ids) n += p.buffers[static_cast<size_t>(id)].type.nbytes();
    return n;
  };
  const int64_t library_calls = std::count_if(gen.dispatches.begin(), gen.dispatches.end(), [](const gpu::Dispatch& d) { return d.library; });
  json stats = {{"kernels", p.kernels.size()}, {"dispatches", gen.dispatches.size()}, {"library_calls", library_calls},
                {"pipelines", gen.modules.size()},
                {"cpu_kernels", cpu_kernels}, {"arena_bytes", p.arena_bytes}, {"device_arena_bytes", arena_bytes},
                {"temporaries_bytes", p.temporaries_bytes}, {"folded_constants", e.graph.folded_constants},
                {"weight_bytes", weight_bytes}, {"state_bytes", sl.bytes}, {"fused_expressions", p.fused_expressions},
                {"input_bytes", io_bytes(p.inputs)}, {"output_bytes", io_bytes(p.outputs)}};
  json m = {{"format", "chroma.webgpu"},
            {"version", kFormatVersion},
            {"dialect", package_dialect()},
            {"compiler_version", CHROMA_VERSION},
            {"requirements", {{"features", json::array()}, {"limits", limits}}},
            {"inputs", code.inputs},
            {"outputs", code.outputs},
            {"output_structure", p.output_structure},
            {"arena", {{"bytes", arena_bytes}, {"status_offset", 0}}},
            {"state", payload.state},
            {"params", {{"offset", payload.params_at}, {"bytes", code.params.size()}}},
            {"weights", {{"shards", payload.shards}, {"tensors", payload.tensors}}},
            {"kernels", kernels},
            {"dispatches", code.dispatches},
            {"entries", code.entry_list},

            {"stats", stats}};
  if (!opts.golden_path.empty()) m["golden"] = payload.golden;  // (compile_entries has no golden data)
  std::string digest_hex;
  const std::vector<uint8_t> file = pack_package(m, payload.bytes, &digest_hex);
  timer.lap("package");

  fs::path out(out_dir);
  std::string stem = out.filename().string();
  if (stem.empty()) stem = out.parent_path().filename().string();
  const fs::path package = out.parent_path() / (stem + package_suffix());
  if (writes_files()) {
    fs::create_directories(out);
    write_file(package.string(), file.data(), file.size());
  }

  // The artifact directory's manifest: the same description as a CPU artifact's, plus the
  // package's name and digest.
  json am;
  am["format"] = "chroma.artifact";
  am["version"] = 3;
  am["compiler_version"] = CHROMA_VERSION;
  am["target"] = name();
  am["options"] = {{"max_expression_depth", std::min(opts.max_expression_depth, 24)}};
  // Reduced weights (Lowerer::reduced_weight) widen inside the kernels; activations stay float32.
  am["options"]["weights"] = describe_weights(entries, opts.weights);
  am["options"]["weights"]["activations"] = "fp32";
  am["options"]["weights"]["attention"] = "fp32";  // the GPU kernels' attention is float32
  json es = json::array();
  for (const CompiledEntry& ce : entries) es.push_back(describe_entry(ce, weight_bytes, sl.bytes));
  for (const char* key : {"inputs", "outputs", "output_structure", "arena", "kernels", "stats"}) am[key] = es[0][key];
  am["stats"]["dispatches"] = gen.dispatches.size();
  am["stats"]["library_calls"] = library_calls;
  am["stats"]["pipelines"] = gen.modules.size();
  am["stats"]["cpu_kernels"] = cpu_kernels;
  am["stats"]["package_bytes"] = file.size();
  am["entries"] = es;
  am["state"] = sl.manifest;
  am["package"] = {{"file", "../" + package.filename().string()}, {"bytes", file.size()}, {"sha256", digest_hex},
                   {"format_version", kFormatVersion}};
  if (writes_files()) write_native(gen, out, opts, timer, &am);
  am["build"] = {{"compile_seconds", timer.total()}, {"phases", timer.json()}};
  const std::string text = am.dump(2);
  if (writes_files()) write_file((out / "manifest.json").string(), text.data(), text.size());
  return text;
}

}  // namespace chroma

// What every target's artifact writer shares: the weights layout, the state layout, the
// manifest's description of an entry point, and file writing.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "ir/graph.h"
#include "lower/program.h"

namespace chroma {

// One compiled entry point: its optimized graph and lowered program.
struct CompiledEntry {
  std::string name;
  size_t imported_nodes = 0;
  Graph graph;
  Program program;
};

// Lays out every constant a kernel of any entry reads, `align`-byte aligned, in first-use
// order; identical contents are stored once (across entries too). A target whose device
// stores tensors differently gives `storage` (the bytes to store for a constant, e.g. int64
// narrowed to 32-bit words on a GPU). With `shard_limit` > 0 the blob is cut into shards of
// at most that many bytes (or one tensor larger than that alone), each starting at a
// multiple of `shard_align`, no tensor straddling two (GPU binding limits).
class WeightsLayout {
 public:
  using Storage = std::function<std::vector<uint8_t>(const ConstantData&, const std::string& name)>;
  explicit WeightsLayout(int64_t align = 64, int64_t shard_limit = 0, Storage storage = nullptr, int64_t shard_align = 256)
      : align_(align), shard_align_(shard_align), shard_limit_(shard_limit), storage_(std::move(storage)) {}

  // Returns the constant's byte offset in the blob.
  int64_t add(const ConstantData& c, const std::string& name);
  // Sets the offset of every constant buffer a kernel of p reads (b.offset); constants no
  // kernel reads (weights replaced by their packed form) are not stored.
  void add_program(Program& p);
  // Pads the blob and computes its digest (sha256-tree-16MiB).
  void finish();
  // From now on the blob goes to the file at `path` as tensors are added, not to `bytes`
  // (the CPU artifact's weights.bin: a model's weights are never all in memory at once).
  void write_to(const std::string& path);
  // The blob's size in bytes (in `bytes` or in the file).
  int64_t size() const { return file_ ? file_size_ : static_cast<int64_t>(bytes.size()); }

  std::vector<uint8_t> bytes;
  std::string digest;
  nlohmann::json tensors = nlohmann::json::array();
  // [start, end) of each shard (one shard covering everything when shard_limit is 0).
  std::vector<std::pair<int64_t, int64_t>> shards;
  int shard_of(int64_t offset) const;

 private:
  int64_t align_, shard_align_, shard_limit_;
  Storage storage_;
  std::map<std::string, int64_t> by_digest_;
  std::shared_ptr<std::ofstream> file_;
  std::string path_;
  int64_t file_size_ = 0;
  void append(int64_t at, const uint8_t* data, size_t n);
};

// Persistent state, one tensor per name across all entries, `align`-byte aligned: sets the
// state buffers' offsets; initial values are added to the weights layout.
struct StateLayout {
  struct Tensor {
    std::string name;
    int64_t offset = 0, nbytes = 0, init_offset = -1;
  };
  std::vector<Tensor> tensors;
  int64_t bytes = 0;
  nlohmann::json manifest = nlohmann::json::array();
};
// `storage_bytes(t)`: the bytes a state tensor of type t takes on the target.
StateLayout layout_state(std::vector<CompiledEntry>& entries, WeightsLayout& wl, int64_t align,
                         const std::function<int64_t(const TensorType&)>& storage_bytes);

// The manifest's description of an entry: inputs, outputs, state used, arena plan, kernels
// and stats.
nlohmann::json describe_entry(const CompiledEntry& e, int64_t weight_bytes, int64_t state_bytes);

// The manifest's options.weights: the policy `spec` and every decision the entries' lowering
// made under it (docs/quantization.md).
nlohmann::json describe_weights(const std::vector<CompiledEntry>& entries, const std::string& spec);

// Writes through a temporary file and a rename, so a process that has the old file mapped
// keeps a consistent view.
void write_file(const std::string& path, const void* data, size_t n);
std::string file_sha256(const std::string& path);

}  // namespace chroma

namespace chroma {

// Seconds per compile phase, summed over entries, for the manifest (`chroma compile --timings`).
class PhaseTimer {
 public:
  PhaseTimer();
  void lap(const char* name);
  double total() const;
  nlohmann::json json() const;

 private:
  double start_, last_;
  std::vector<std::pair<std::string, double>> phases_;
};

}  // namespace chroma

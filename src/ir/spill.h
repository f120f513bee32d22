// Constants a compile makes (packed, quantized or relaid-out weights) moved out of the
// process's anonymous memory: each is written to one scratch file and replaced by a read-only
// mapping of its bytes (a Blob view). Its pages are then the page cache's, which the kernel
// writes back and can drop, and the artifact writer reads them through the mapping. A model
// whose weights do not fit in memory compiles with anonymous memory bounded by one tensor at a
// time (docs/architecture.md, "Compile memory").
//
// The file is created when the first constant is spilled, in a directory the compile writes
// anyway (the artifact's, created then if need be), and unlinked at once: nothing is left
// behind, even by a killed process. Thread-safe: kernels' constants may be
// packed from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/blob.h"

namespace chroma {

class SpillFile {
 public:
  // Spills constants of at least `min_bytes` once `after_bytes` of constants were made in
  // memory (0: from the first), into a file in `dir`.
  SpillFile(const std::string& dir, int64_t after_bytes, int64_t min_bytes = 1 << 16);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  // The bytes as a blob: kept in memory, or written to the file and mapped.
  BlobPtr put(std::vector<uint8_t> bytes);

  int64_t spilled_bytes() const;
  int64_t kept_bytes() const;

 private:
  struct Fd;
  std::shared_ptr<Fd> fd_;
  std::string dir_, path_;
  int64_t after_, min_;
  mutable std::mutex mu_;
  int64_t end_ = 0, spilled_ = 0, kept_ = 0;
  void open();  // under mu_
};

// Where a compile's constants go: to the spill file when there is one, else kept in memory.
inline BlobPtr make_blob(std::vector<uint8_t> bytes, SpillFile* spill) {
  return spill ? spill->put(std::move(bytes)) : make_blob(std::move(bytes));
}

}  // namespace chroma

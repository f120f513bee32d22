// The bytes of a constant (weights and folded values), shared between graphs, never mutated
// once shared. Owned, or a view into a read-only mapping of a file that the blob keeps alive:
// a graph file's weights are not copied into memory but read from the file's pages as a pass,
// the lowering or the artifact writer uses them, pages the kernel can drop again (a model
// larger than memory compiles; docs/architecture.md, "Compile memory").
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace chroma {

class Blob {
 public:
  explicit Blob(std::vector<uint8_t> bytes) : own_(std::move(bytes)), p_(own_.data()), n_(own_.size()) {}
  // `n` bytes at `p`, valid while `keep` lives (a file mapping).
  Blob(std::shared_ptr<const void> keep, const uint8_t* p, size_t n) : keep_(std::move(keep)), p_(p), n_(n) {}
  Blob(const Blob&) = delete;
  Blob& operator=(const Blob&) = delete;

  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const uint8_t* begin() const { return p_; }
  const uint8_t* end() const { return p_ + n_; }
  // An owned blob's bytes, for the code that fills it before sharing it.
  uint8_t* writable() { return own_.data(); }
  bool mapped() const { return keep_ != nullptr; }
  bool operator==(const Blob& o) const { return n_ == o.n_ && (n_ == 0 || std::memcmp(p_, o.p_, n_) == 0); }

 private:
  std::vector<uint8_t> own_;
  std::shared_ptr<const void> keep_;
  const uint8_t* p_;
  size_t n_;
};

using BlobPtr = std::shared_ptr<const Blob>;

inline BlobPtr make_blob(std::vector<uint8_t> bytes) { return std::make_shared<const Blob>(std::move(bytes)); }

}  // namespace chroma

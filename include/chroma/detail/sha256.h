// SHA-256 (FIPS 180-4) through OpenSSL's libcrypto, and the chunked digest of weights files.
//
// Used by the compiler to fingerprint artifacts and weights, and by the generated runtime code to
// verify them at load. OpenSSL picks the fastest implementation the CPU has at run time (SHA-NI
// where the CPU has it, several times faster than a portable C++ one: bench/results/README.md), so
// anything that includes this header links -lcrypto. Header-only, all `inline`, valid C++17
// (generated code includes it).
//
//   chroma::detail::Sha256 h;
//   h.update(data, n);                  // any number of times, any chunk sizes
//   std::string hex = h.hex_digest();   // 64 lowercase hex characters
// or simply chroma::detail::sha256_hex(data, n).
//
// digest()/hex_digest() do not disturb the running state: they finish a copy of it, so they
// may be called repeatedly, and update() may continue afterwards. reset() starts over.
//
// sha256_tree_hex(data, n, threads): the digest Chroma records for weights files
// ("sha256-tree-16MiB", docs/artifact_format.md). One SHA-256 cannot be split between
// threads; this digest hashes each 16 MiB chunk on its own (in parallel) and then the list of
// chunk digests, so verification runs at the threads' combined speed.
#pragma once

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace chroma::detail {

class Sha256 {
 public:
  static constexpr size_t kDigestSize = 32;  // bytes of output

  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_) throw std::bad_alloc();
    reset();
  }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256() { EVP_MD_CTX_free(ctx_); }

  void reset() {
    EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
    bytes_ = 0;
  }

  void update(const void* data, size_t n) {
    if (n) EVP_DigestUpdate(ctx_, data, n);
    bytes_ += n;
  }
  uint64_t bytes_processed() const { return bytes_; }
  void update(std::string_view s) { update(s.data(), s.size()); }

  // The 32-byte digest of everything fed so far. Does not modify the running state.
  std::array<uint8_t, kDigestSize> digest() const {
    std::array<uint8_t, kDigestSize> out{};
    EVP_MD_CTX* copy = EVP_MD_CTX_new();
    if (!copy) throw std::bad_alloc();
    EVP_MD_CTX_copy_ex(copy, ctx_);
    unsigned int len = 0;
    EVP_DigestFinal_ex(copy, out.data(), &len);
    EVP_MD_CTX_free(copy);
    return out;
  }

  // digest() as 64 lowercase hexadecimal characters.
  std::string hex_digest() const { return to_hex(digest().data(), kDigestSize); }

  static std::string to_hex(const uint8_t* d, size_t n) {
    static const char kHex[] = "0123456789abcdef";
    std::string s(2 * n, '0');
    for (size_t i = 0; i < n; ++i) {
      s[2 * i] = kHex[d[i] >> 4];
      s[2 * i + 1] = kHex[d[i] & 15];
    }
    return s;
  }

 private:
  EVP_MD_CTX* ctx_;
  uint64_t bytes_ = 0;
};

inline std::array<uint8_t, Sha256::kDigestSize> sha256(const void* data, size_t n) {
  std::array<uint8_t, Sha256::kDigestSize> out{};
  unsigned int len = 0;
  static const uint8_t kEmpty = 0;
  EVP_Digest(n ? data : &kEmpty, n, out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

inline std::string sha256_hex(const void* data, size_t n) {
  const auto d = sha256(data, n);
  return Sha256::to_hex(d.data(), d.size());
}
inline std::string sha256_hex(std::string_view s) { return sha256_hex(s.data(), s.size()); }

// The chunked weights digest: SHA-256 over the 16-byte header "chroma-tree-v1\0\0", the total
// length (u64 little-endian), then the SHA-256 of each consecutive 16 MiB chunk (the last
// one shorter; none for empty data). `threads` chunks are hashed at a time.
inline constexpr size_t kTreeChunk = size_t{16} << 20;
inline constexpr const char* kTreeAlgorithm = "sha256-tree-16MiB";

// The same, calling fill(offset, length) on the hashing thread just before each chunk is
// hashed (a loader reads the chunk into place there, so reading and hashing overlap and the
// bytes are hashed while still in cache). Returns "" if any fill returns false.
template <class Fill>
inline std::string sha256_tree_hex_filled(const void* data, size_t n, int threads, Fill&& fill) {
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t chunks = (n + kTreeChunk - 1) / kTreeChunk;
  std::vector<std::array<uint8_t, Sha256::kDigestSize>> parts(chunks);
  std::vector<char> ok(chunks, 1);
  auto work = [&](size_t first, size_t step) {
    for (size_t c = first; c < chunks; c += step) {
      const size_t off = c * kTreeChunk, len = std::min(kTreeChunk, n - off);
      if (!fill(off, len)) {
        ok[c] = 0;
        continue;
      }
      parts[c] = sha256(p + off, len);
    }
  };
  const size_t t = std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads > 0 ? threads : 1), chunks));
  std::vector<std::thread> pool;
  try {
    for (size_t i = 1; i < t; ++i) pool.emplace_back(work, i, t);
  } catch (const std::exception&) {
    // Could not start a thread: the caller's thread does the chunks of the missing ones.
    for (size_t i = pool.size() + 1; i < t; ++i) work(i, t);
  }
  work(0, t);
  for (std::thread& th : pool) th.join();
  for (char c : ok) {
    if (!c) return std::string();
  }
  Sha256 h;
  const char header[16] = "chroma-tree-v1";
  h.update(header, sizeof header);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(n) >> (8 * i));
  h.update(len, sizeof len);
  for (const auto& d : parts) h.update(d.data(), d.size());
  return h.hex_digest();
}

inline std::string sha256_tree_hex(const void* data, size_t n, int threads = 1) {
  return sha256_tree_hex_filled(data, n, threads, [](size_t, size_t) { return true; });
}

}  // namespace chroma::detail

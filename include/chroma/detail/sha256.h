// SHA-256 (FIPS 180-4), header-only.
//
// Used by the compiler to fingerprint artifacts and weights, and by the generated runtime code
// to verify them, so this header has hard constraints:
//   * no dependencies beyond the C++ standard library;
//   * everything `inline` (it is included from many translation units);
//   * valid C++17 (generated code may be built with an older -std than the compiler itself).
//
// Usage:
//   chroma::detail::Sha256 h;
//   h.update(data, n);             // any number of times, any chunk sizes
//   std::string hex = h.hex_digest();   // 64 lowercase hex characters
// or simply chroma::detail::sha256_hex(data, n).
//
// digest()/hex_digest() do not disturb the running state: they finish a copy of it, so they
// may be called repeatedly, and update() may continue afterwards (the digest then covers all
// bytes fed so far). reset() starts over.
//
// Performance: update() compresses whole 64-byte blocks straight out of the caller's memory;
// only a partial block at the start or end of a call is staged in the internal buffer. Words
// are loaded big-endian with byte shifts (no alignment or endianness assumptions), which
// compilers turn into a single load + bswap. Expect a few hundred MB/s per core at -O2.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace chroma::detail {

class Sha256 {
 public:
  static constexpr size_t kBlockSize = 64;   // bytes per compression block
  static constexpr size_t kDigestSize = 32;  // bytes of output

  Sha256() { reset(); }

  // Forgets all input; the object is as freshly constructed.
  void reset() {
    state_ = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
              0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    buffer_len_ = 0;
    total_len_ = 0;
  }

  // Feeds `n` bytes at `data` (which may be null when n == 0).
  void update(const void* data, size_t n) {
    if (n == 0) return;  // also keeps a null `data` away from memcpy
    const unsigned char* p = static_cast<const unsigned char*>(data);
    total_len_ += static_cast<uint64_t>(n);
    // Top up a partially filled staging buffer first.
    if (buffer_len_ > 0) {
      const size_t take = n < kBlockSize - buffer_len_ ? n : kBlockSize - buffer_len_;
      std::memcpy(buffer_.data() + buffer_len_, p, take);
      buffer_len_ += take;
      p += take;
      n -= take;
      if (buffer_len_ < kBlockSize) return;
      compress(state_, buffer_.data(), 1);
      buffer_len_ = 0;
    }
    // Whole blocks straight from the input, no copy.
    const size_t blocks = n / kBlockSize;
    if (blocks > 0) {
      compress(state_, p, blocks);
      p += blocks * kBlockSize;
      n -= blocks * kBlockSize;
    }
    // Stage the tail.
    if (n > 0) {
      std::memcpy(buffer_.data(), p, n);
      buffer_len_ = n;
    }
  }

  void update(std::string_view s) { update(s.data(), s.size()); }

  // The 32-byte digest of everything fed so far. Does not modify the running state.
  std::array<uint8_t, kDigestSize> digest() const {
    // Padding: a 0x80 byte, zeros up to 56 mod 64, then the message length in bits as a
    // 64-bit big-endian integer. That is one or two final blocks.
    std::array<uint32_t, 8> st = state_;
    unsigned char tail[2 * kBlockSize] = {};
    std::memcpy(tail, buffer_.data(), buffer_len_);
    tail[buffer_len_] = 0x80;
    const size_t tail_len = buffer_len_ + 1 + 8 <= kBlockSize ? kBlockSize : 2 * kBlockSize;
    const uint64_t bits = total_len_ * 8u;
    for (int i = 0; i < 8; ++i) {
      tail[tail_len - 1 - static_cast<size_t>(i)] = static_cast<unsigned char>(bits >> (8 * i));
    }
    compress(st, tail, tail_len / kBlockSize);

    std::array<uint8_t, kDigestSize> out{};
    for (size_t i = 0; i < 8; ++i) {
      out[4 * i + 0] = static_cast<uint8_t>(st[i] >> 24);
      out[4 * i + 1] = static_cast<uint8_t>(st[i] >> 16);
      out[4 * i + 2] = static_cast<uint8_t>(st[i] >> 8);
      out[4 * i + 3] = static_cast<uint8_t>(st[i]);
    }
    return out;
  }

  // digest() as 64 lowercase hexadecimal characters.
  std::string hex_digest() const {
    static constexpr char kHex[] = "0123456789abcdef";
    const std::array<uint8_t, kDigestSize> d = digest();
    std::string s(2 * kDigestSize, '0');
    for (size_t i = 0; i < kDigestSize; ++i) {
      s[2 * i] = kHex[d[i] >> 4];
      s[2 * i + 1] = kHex[d[i] & 0xf];
    }
    return s;
  }

  // Total bytes fed since construction or the last reset().
  uint64_t bytes_processed() const { return total_len_; }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  static uint32_t load_be32(const unsigned char* p) {
    return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
           (static_cast<uint32_t>(p[2]) << 8) | static_cast<uint32_t>(p[3]);
  }

  // Applies the compression function to `blocks` consecutive 64-byte blocks at `p`.
  static void compress(std::array<uint32_t, 8>& state, const unsigned char* p, size_t blocks) {
    // Round constants: first 32 bits of the fractional parts of the cube roots of the first
    // 64 primes (FIPS 180-4, section 4.2.2).
    static constexpr uint32_t kK[64] = {
        0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u,
        0x923f82a4u, 0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u,
        0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u,
        0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
        0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u,
        0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u,
        0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
        0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
        0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au,
        0x5b9cca4fu, 0x682e6ff3u, 0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u,
        0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

    uint32_t h0 = state[0], h1 = state[1], h2 = state[2], h3 = state[3];
    uint32_t h4 = state[4], h5 = state[5], h6 = state[6], h7 = state[7];
    uint32_t w[64];
    for (size_t blk = 0; blk < blocks; ++blk, p += kBlockSize) {
      // Message schedule.
      for (int t = 0; t < 16; ++t) w[t] = load_be32(p + 4 * t);
      for (int t = 16; t < 64; ++t) {
        const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
      }
      // 64 rounds.
      uint32_t a = h0, b = h1, c = h2, d = h3, e = h4, f = h5, g = h6, h = h7;
      for (int t = 0; t < 64; ++t) {
        const uint32_t big_s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
        const uint32_t ch = (e & f) ^ (~e & g);
        const uint32_t t1 = h + big_s1 + ch + kK[t] + w[t];
        const uint32_t big_s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
        const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        const uint32_t t2 = big_s0 + maj;
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
      }
      h0 += a; h1 += b; h2 += c; h3 += d;
      h4 += e; h5 += f; h6 += g; h7 += h;
    }
    state[0] = h0; state[1] = h1; state[2] = h2; state[3] = h3;
    state[4] = h4; state[5] = h5; state[6] = h6; state[7] = h7;
  }

  std::array<uint32_t, 8> state_{};
  std::array<unsigned char, kBlockSize> buffer_{};
  size_t buffer_len_ = 0;
  uint64_t total_len_ = 0;  // bytes; the bit length is total_len_ * 8 mod 2^64
};

// One-shot helpers: SHA-256 of `n` bytes at `data` (or of `s`) as 64 lowercase hex chars.
inline std::string sha256_hex(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex_digest();
}

inline std::string sha256_hex(std::string_view s) { return sha256_hex(s.data(), s.size()); }

}  // namespace chroma::detail

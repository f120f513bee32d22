// Tests for the header-only SHA-256 in include/chroma/detail/sha256.h.
#include "chroma/detail/sha256.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

using chroma::detail::Sha256;
using chroma::detail::sha256_hex;

// FIPS 180-4 / NIST example vectors.
TEST(Sha256, EmptyString) {
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(nullptr, 0),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, Abc) {
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(std::string("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, TwoBlockMessage448Bits) {
  const std::string m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  ASSERT_EQ(m.size(), 56u);
  EXPECT_EQ(sha256_hex(m.data(), m.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, Message896Bits) {
  const std::string m =
      "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlm"
      "nopqrsmnopqrstnopqrstu";
  ASSERT_EQ(m.size(), 112u);
  EXPECT_EQ(sha256_hex(m), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, MillionAsInUnevenChunks) {
  const std::string expected = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  const std::string a(1000000, 'a');
  // Chunk sizes cycle through values that straddle block boundaries in every way.
  const size_t chunks[] = {1, 63, 64, 65, 7, 128, 1000, 3, 4097, 55, 56, 0, 9999};
  Sha256 h;
  size_t pos = 0, k = 0;
  while (pos < a.size()) {
    size_t c = chunks[k++ % (sizeof chunks / sizeof chunks[0])];
    if (c > a.size() - pos) c = a.size() - pos;
    h.update(a.data() + pos, c);
    pos += c;
  }
  EXPECT_EQ(h.bytes_processed(), 1000000u);
  EXPECT_EQ(h.hex_digest(), expected);
  EXPECT_EQ(sha256_hex(a.data(), a.size()), expected);
}

// Lengths around the padding boundaries (55/56 bytes: one vs two final blocks; 64: exact
// block). Expected values computed with an independent implementation (Python hashlib).
TEST(Sha256, PaddingBoundaries) {
  const struct {
    size_t n;
    const char* hex;
  } cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {57, "f13b2d724659eb3bf47f2dd6af1accc87b81f09f59f2b75e5c0bed6589dfe8c6"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
      {128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"},
  };
  for (const auto& c : cases) {
    const std::string m(c.n, 'a');
    EXPECT_EQ(sha256_hex(m.data(), m.size()), c.hex) << "length " << c.n;
    // Byte-at-a-time must agree too.
    Sha256 h;
    for (char ch : m) h.update(&ch, 1);
    EXPECT_EQ(h.hex_digest(), c.hex) << "length " << c.n << " byte by byte";
  }
}

TEST(Sha256, DigestMatchesHexAndIsRepeatable) {
  Sha256 h;
  h.update("abc", 3);
  const auto d = h.digest();
  EXPECT_EQ(d[0], 0xba);
  EXPECT_EQ(d[31], 0xad);
  // digest() does not consume the state: calling it again, or hex_digest(), agrees.
  EXPECT_EQ(h.digest(), d);
  EXPECT_EQ(h.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Updating after a digest continues the same message.
  h.update("def", 3);
  EXPECT_EQ(h.hex_digest(), sha256_hex("abcdef", 6));
  h.reset();
  EXPECT_EQ(h.hex_digest(), sha256_hex("", 0));
}

TEST(Sha256, ChunkedEqualsOneShotOnRandomData) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = std::uniform_int_distribution<size_t>(0, 5000)(rng);
    std::vector<uint8_t> data(n);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    const std::string one_shot = sha256_hex(data.data(), data.size());

    Sha256 h;
    size_t pos = 0;
    while (pos < n) {
      size_t c = std::uniform_int_distribution<size_t>(0, 200)(rng);
      if (c > n - pos) c = n - pos;
      h.update(data.data() + pos, c);
      pos += c;
    }
    ASSERT_EQ(h.hex_digest(), one_shot) << "trial " << trial << " n=" << n;
  }
}

// A large input through an odd offset (so every block is staged/unaligned) agrees with the
// one-shot digest. Speed is measured in bench/, never asserted in unit tests.
TEST(Sha256, LargeInputChunkedAtOddOffset) {
  std::vector<uint8_t> data(8u << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  const std::string hex = sha256_hex(data.data(), data.size());
  EXPECT_EQ(hex.size(), 64u);
  Sha256 h;
  h.update(data.data(), 1);
  h.update(data.data() + 1, data.size() - 1);
  EXPECT_EQ(h.hex_digest(), hex);
}

// The chunked weights digest (sha256-tree-16MiB): rebuilt here from its definition in
// docs/artifact_format.md, and the same whatever the number of threads.
std::string tree_by_definition(const std::vector<uint8_t>& d) {
  Sha256 h;
  const char header[16] = "chroma-tree-v1";
  h.update(header, sizeof header);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(d.size()) >> (8 * i));
  h.update(len, 8);
  const size_t chunk = size_t{16} << 20;
  for (size_t off = 0; off < d.size(); off += chunk) {
    const auto part = chroma::detail::sha256(d.data() + off, std::min(chunk, d.size() - off));
    h.update(part.data(), part.size());
  }
  return h.hex_digest();
}

TEST(Sha256Tree, MatchesDefinitionForAnyThreadCount) {
  std::mt19937 rng(7);
  for (size_t n : {size_t{0}, size_t{1}, (size_t{16} << 20) - 1, size_t{16} << 20, (size_t{40} << 20) + 3}) {
    std::vector<uint8_t> d(n);
    for (auto& b : d) b = static_cast<uint8_t>(rng());
    const std::string want = tree_by_definition(d);
    for (int threads : {1, 2, 3, 8}) {
      EXPECT_EQ(chroma::detail::sha256_tree_hex(d.data(), d.size(), threads), want) << "n=" << n << " threads=" << threads;
    }
  }
}

TEST(Sha256Tree, DiffersFromPlainSha256AndSeesEveryByte) {
  std::vector<uint8_t> d((size_t{20} << 20), 0);
  const std::string base = chroma::detail::sha256_tree_hex(d.data(), d.size(), 2);
  EXPECT_NE(base, sha256_hex(d.data(), d.size()));
  d[(size_t{18} << 20)] ^= 1;  // a byte in the second chunk
  EXPECT_NE(chroma::detail::sha256_tree_hex(d.data(), d.size(), 2), base);
}

}  // namespace

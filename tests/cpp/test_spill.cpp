// ir/spill.h: constants kept in memory up to the threshold, then written to the scratch file and
// mapped; the bytes are the same either way, and the file leaves no name behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "ir/dtype.h"
#include "ir/spill.h"

namespace chroma {
namespace {

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  std::iota(v.begin(), v.end(), seed);
  return v;
}

TEST(Spill, KeepsUpToTheThresholdThenMapsFromTheFile) {
  const auto dir = std::filesystem::temp_directory_path() / "chroma_test_spill";
  std::filesystem::remove_all(dir);
  std::vector<BlobPtr> blobs;
  {
    SpillFile spill(dir.string(), /*after_bytes=*/100000, /*min_bytes=*/1000);
    blobs.push_back(spill.put(pattern(70000, 1)));   // kept: 70000 <= 100000
    blobs.push_back(spill.put(pattern(500, 2)));     // kept: under min_bytes
    blobs.push_back(spill.put(pattern(70000, 3)));   // spilled: 70500 + 70000 > 100000
    blobs.push_back(spill.put(pattern(40001, 4)));   // spilled (110501 > 100000), not a whole page
    blobs.push_back(spill.put({}));                  // empty: kept
    EXPECT_FALSE(blobs[0]->mapped());
    EXPECT_FALSE(blobs[1]->mapped());
    EXPECT_TRUE(blobs[2]->mapped());
    EXPECT_TRUE(blobs[3]->mapped());
    EXPECT_TRUE(blobs[4]->empty());
    EXPECT_EQ(spill.kept_bytes(), 70500);
    EXPECT_EQ(spill.spilled_bytes(), 110001);
    // The file was unlinked as soon as it was made.
    EXPECT_TRUE(std::filesystem::is_empty(dir));
  }
  // The blobs outlive the SpillFile (they keep the descriptor and their mappings).
  const uint8_t seeds[] = {1, 2, 3, 4};
  const size_t sizes[] = {70000, 500, 70000, 40001};
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(blobs[i]->size(), sizes[i]);
    EXPECT_TRUE(*blobs[i] == Blob(pattern(sizes[i], seeds[i]))) << i;
  }
  std::filesystem::remove_all(dir);
}

TEST(Spill, NothingSpilledCreatesNoFileOrDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "chroma_test_spill_none";
  std::filesystem::remove_all(dir);
  SpillFile spill(dir.string(), int64_t{1} << 30);
  BlobPtr b = spill.put(pattern(1 << 20, 7));
  EXPECT_FALSE(b->mapped());
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(Spill, AnUnwritableDirectoryIsACompileErrorNamingIt) {
  SpillFile spill("/proc/chroma-no-such-dir", 0, 1);
  try {
    spill.put(pattern(4096, 1));
    FAIL() << "expected a CompileError";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/chroma-no-such-dir"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace chroma

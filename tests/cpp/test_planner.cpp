// Tests for the greedy arena planner in src/memory/planner.h.
#include "memory/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using chroma::memory::ArenaPlanner;

// ---------------------------------------------------------------------------------------------
// Hand-written cases
// ---------------------------------------------------------------------------------------------

TEST(Planner, EmptyPlan) {
  ArenaPlanner p;
  p.plan();
  EXPECT_EQ(p.size(), 0u);
  EXPECT_EQ(p.arena_size(), 0);
  EXPECT_EQ(p.lower_bound(), 0);
  EXPECT_EQ(p.total_bytes(), 0);
  EXPECT_TRUE(p.check());
  EXPECT_NE(p.describe().find("arena_size=0"), std::string::npos);
}

TEST(Planner, DisjointLifetimesShareOffsetZero) {
  ArenaPlanner p(64);
  const int a = p.add_buffer(1000, 0, 1);
  const int b = p.add_buffer(1000, 2, 3);
  const int c = p.add_buffer(500, 4, 4);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 2);
  p.plan();
  EXPECT_EQ(p.offset(a), 0);
  EXPECT_EQ(p.offset(b), 0);
  EXPECT_EQ(p.offset(c), 0);
  EXPECT_EQ(p.arena_size(), 1024);
  EXPECT_EQ(p.lower_bound(), 1024);
  EXPECT_EQ(p.total_bytes(), 1024 + 1024 + 512);
  EXPECT_TRUE(p.check());
}

TEST(Planner, OverlappingLifetimesDoNotOverlap) {
  ArenaPlanner p(64);
  const int a = p.add_buffer(100, 0, 2);
  const int b = p.add_buffer(200, 1, 3);  // shares kernels 1..2 with a
  const int c = p.add_buffer(64, 2, 2);   // shares kernel 2 with both
  p.plan();
  std::string why;
  EXPECT_TRUE(p.check(&why)) << why;
  // Largest first: b at 0 (256 bytes), then a at 256 (128 bytes), then c at 384.
  EXPECT_EQ(p.offset(b), 0);
  EXPECT_EQ(p.offset(a), 256);
  EXPECT_EQ(p.offset(c), 384);
  EXPECT_EQ(p.arena_size(), 448);
  EXPECT_EQ(p.lower_bound(), 448);
}

TEST(Planner, LifetimesAreInclusive) {
  // a is last read by kernel 3, which is also where b is written: they conflict.
  ArenaPlanner p(16);
  const int a = p.add_buffer(16, 0, 3);
  const int b = p.add_buffer(16, 3, 5);
  p.plan();
  EXPECT_NE(p.offset(a), p.offset(b));
  EXPECT_EQ(p.arena_size(), 32);
  EXPECT_TRUE(p.check());
}

TEST(Planner, ReusesGapBetweenBuffers) {
  // y (largest, kernels 0..3) goes to 0 and x (0..1) above it at 1280. z (2..3) conflicts only
  // with y, so once x is dead it reuses x's bytes at 1280 instead of growing the arena.
  ArenaPlanner p(64);
  const int x = p.add_buffer(640, 0, 1);
  const int y = p.add_buffer(1280, 0, 3);
  const int z = p.add_buffer(320, 2, 3);
  p.plan();
  EXPECT_TRUE(p.check());
  EXPECT_EQ(p.offset(y), 0);
  EXPECT_EQ(p.offset(x), 1280);
  EXPECT_EQ(p.offset(z), 1280);
  EXPECT_EQ(p.arena_size(), 1920);
}

TEST(Planner, FitsIntoExactGap) {
  // Two long-lived buffers with a 128-byte hole between them (left by a short-lived one); a
  // later 128-byte buffer must land exactly in the hole rather than on top.
  ArenaPlanner p(64);
  const int big = p.add_buffer(1024, 0, 10);     // offset 0
  const int hole = p.add_buffer(512, 0, 1);      // offset 1024, dies at 1
  const int mid = p.add_buffer(256, 0, 10);      // offset 1536
  const int fill = p.add_buffer(128, 5, 6);      // fits at 1024
  p.plan();
  EXPECT_TRUE(p.check());
  EXPECT_EQ(p.offset(big), 0);
  EXPECT_EQ(p.offset(hole), 1024);
  EXPECT_EQ(p.offset(mid), 1536);
  EXPECT_EQ(p.offset(fill), 1024);
  EXPECT_EQ(p.arena_size(), 1792);
}

TEST(Planner, ZeroSizeBuffers) {
  ArenaPlanner p(64);
  const int z0 = p.add_buffer(0, 0, 5);
  const int a = p.add_buffer(64, 0, 5);
  const int z1 = p.add_buffer(0, 2, 3);
  p.plan();
  EXPECT_EQ(p.buffer_size(z0), 0);
  EXPECT_EQ(p.aligned_size(z0), 0);
  EXPECT_EQ(p.offset(z0), 0);
  EXPECT_EQ(p.offset(z1), 0);
  EXPECT_EQ(p.offset(a), 0);  // empty ranges overlap nothing
  EXPECT_EQ(p.arena_size(), 64);
  EXPECT_EQ(p.lower_bound(), 64);
  EXPECT_EQ(p.total_bytes(), 64);
  EXPECT_TRUE(p.check());

  ArenaPlanner only_zero;
  only_zero.add_buffer(0, 0, 0);
  only_zero.plan();
  EXPECT_EQ(only_zero.arena_size(), 0);
  EXPECT_TRUE(only_zero.check());
  EXPECT_FALSE(only_zero.describe().empty());
}

TEST(Planner, Alignment) {
  ArenaPlanner p(64);
  const int a = p.add_buffer(1, 0, 1);
  const int b = p.add_buffer(65, 0, 1);
  const int c = p.add_buffer(64, 0, 1);
  EXPECT_EQ(p.aligned_size(a), 64);
  EXPECT_EQ(p.aligned_size(b), 128);
  EXPECT_EQ(p.aligned_size(c), 64);
  EXPECT_EQ(p.buffer_size(b), 65);
  p.plan();
  for (int id : {a, b, c}) EXPECT_EQ(p.offset(id) % 64, 0) << id;
  EXPECT_EQ(p.arena_size(), 256);
  EXPECT_TRUE(p.check());

  // A non-power-of-two alignment works too.
  ArenaPlanner q(48);
  q.add_buffer(10, 0, 0);
  q.add_buffer(50, 0, 0);
  q.plan();
  EXPECT_EQ(q.arena_size(), 48 + 96);
  EXPECT_EQ(q.arena_size() % 48, 0);
  EXPECT_TRUE(q.check());

  // Alignment 1: byte-exact packing.
  ArenaPlanner r(1);
  r.add_buffer(3, 0, 0);
  r.add_buffer(5, 0, 0);
  r.plan();
  EXPECT_EQ(r.arena_size(), 8);
  EXPECT_TRUE(r.check());
}

TEST(Planner, TieBreakIsEarlierFirstThenId) {
  ArenaPlanner p(64);
  const int late = p.add_buffer(64, 1, 2);
  const int early = p.add_buffer(64, 0, 2);
  const int early2 = p.add_buffer(64, 0, 2);
  p.plan();
  EXPECT_EQ(p.offset(early), 0);
  EXPECT_EQ(p.offset(early2), 64);
  EXPECT_EQ(p.offset(late), 128);
}

TEST(Planner, InvalidArguments) {
  EXPECT_THROW(ArenaPlanner(0), std::invalid_argument);
  EXPECT_THROW(ArenaPlanner(-64), std::invalid_argument);
  ArenaPlanner p;
  try {
    p.add_buffer(10, 5, 3);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find('5'), std::string::npos) << msg;
    EXPECT_NE(msg.find('3'), std::string::npos) << msg;
  }
  EXPECT_THROW(p.add_buffer(-1, 0, 0), std::invalid_argument);
  EXPECT_THROW(p.add_buffer(1, -1, 0), std::invalid_argument);
  EXPECT_EQ(p.size(), 0u);

  // Queries before plan() and on unknown ids.
  p.add_buffer(10, 0, 0);
  EXPECT_THROW(p.offset(0), std::logic_error);
  EXPECT_THROW(p.arena_size(), std::logic_error);
  EXPECT_FALSE(p.check());
  EXPECT_EQ(p.lower_bound(), 64);  // does not need a plan
  EXPECT_NE(p.describe().find("not planned"), std::string::npos);
  p.plan();
  EXPECT_THROW(p.offset(1), std::out_of_range);
  EXPECT_THROW(p.offset(-1), std::out_of_range);
  EXPECT_THROW(p.buffer_size(7), std::out_of_range);
  // Adding a buffer invalidates the plan.
  p.add_buffer(10, 0, 0);
  EXPECT_FALSE(p.planned());
  EXPECT_THROW(p.arena_size(), std::logic_error);
  p.plan();
  EXPECT_TRUE(p.check());
}

TEST(Planner, CheckDetectsOverlap) {
  ArenaPlanner p(64);
  const int a = p.add_buffer(128, 0, 2);
  const int b = p.add_buffer(64, 1, 3);
  const int c = p.add_buffer(64, 5, 6);  // conflicts with nobody
  p.plan();
  ASSERT_TRUE(p.check());
  ASSERT_EQ(p.offset(a), 0);

  // Move b onto a's second half: same kernels 1..2, overlapping bytes.
  p.set_offset_for_testing(b, 64);
  std::string why;
  EXPECT_FALSE(p.check(&why));
  EXPECT_NE(why.find("buffers 0 and 1"), std::string::npos) << why;

  // c may sit anywhere inside the arena: its lifetime conflicts with nobody.
  p.set_offset_for_testing(b, p.offset(a) + 128);
  ASSERT_TRUE(p.check(&why)) << why;
  p.set_offset_for_testing(c, 64);
  EXPECT_TRUE(p.check(&why)) << why;

  // Misalignment and out-of-arena placements are caught as well.
  p.set_offset_for_testing(c, 32);
  EXPECT_FALSE(p.check(&why));
  EXPECT_NE(why.find("buffer 2"), std::string::npos) << why;
  EXPECT_NE(why.find("multiple"), std::string::npos) << why;
  p.set_offset_for_testing(c, p.arena_size());
  EXPECT_FALSE(p.check(&why));
  EXPECT_NE(why.find("exceeds"), std::string::npos) << why;
  p.set_offset_for_testing(c, -64);
  EXPECT_FALSE(p.check(&why));
}

TEST(Planner, DescribeShowsMapTableAndSummary) {
  ArenaPlanner p(64);
  p.add_buffer(256, 0, 1);  // a
  p.add_buffer(128, 1, 2);  // b
  p.add_buffer(128, 2, 3);  // c
  p.plan();
  const std::string d = p.describe(32);
  // One row per kernel index 0..3, 32 columns between bars.
  EXPECT_NE(d.find("        0 |"), std::string::npos) << d;
  EXPECT_NE(d.find("        3 |"), std::string::npos) << d;
  EXPECT_NE(d.find("arena_size=384"), std::string::npos) << d;
  EXPECT_NE(d.find("lower_bound=384"), std::string::npos) << d;
  EXPECT_NE(d.find("total=512"), std::string::npos) << d;
  // Row 0: only a is live, in the first 2/3 of the arena.
  const size_t row0 = d.find("        0 |");
  ASSERT_NE(row0, std::string::npos);
  const std::string cells = d.substr(row0 + 11, 32);
  // Columns are 12 bytes wide; a covers bytes [0, 256), touching columns 0..21.
  EXPECT_EQ(cells.find_first_not_of('a'), 22u) << d;
  EXPECT_EQ(cells.back(), '.') << d;
  // Table lists every buffer.
  EXPECT_NE(d.find("offset"), std::string::npos);
  // Long idle stretches collapse into one row.
  ArenaPlanner q(64);
  q.add_buffer(64, 0, 100);
  q.plan();
  EXPECT_NE(q.describe().find("0..100 |"), std::string::npos) << q.describe();
}

TEST(Planner, PlanIsDeterministicAndIdempotent) {
  ArenaPlanner p(32);
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    const int f = static_cast<int>(rng() % 50);
    p.add_buffer(static_cast<int64_t>(rng() % 5000), f, f + static_cast<int>(rng() % 10));
  }
  p.plan();
  std::vector<int64_t> offsets;
  for (int i = 0; i < 200; ++i) offsets.push_back(p.offset(i));
  const int64_t arena = p.arena_size();
  p.plan();
  for (int i = 0; i < 200; ++i) EXPECT_EQ(p.offset(i), offsets[static_cast<size_t>(i)]);
  EXPECT_EQ(p.arena_size(), arena);
}

// ---------------------------------------------------------------------------------------------
// Property tests over random instances
// ---------------------------------------------------------------------------------------------

struct Spec {
  int64_t size;
  int first, last;
};

// Independent, deliberately naive reference for the greedy rule: same order, and for each
// buffer the lowest multiple of `alignment` that overlaps no conflicting placed buffer, found by
// trying every multiple in turn.
std::vector<int64_t> reference_plan(const std::vector<Spec>& specs, int64_t alignment) {
  auto aligned = [&](int64_t s) { return (s + alignment - 1) / alignment * alignment; };
  std::vector<int> order(specs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const Spec& x = specs[static_cast<size_t>(a)];
    const Spec& y = specs[static_cast<size_t>(b)];
    if (x.size != y.size) return x.size > y.size;
    return x.first < y.first;
  });
  std::vector<int64_t> off(specs.size(), -1);
  std::vector<int> done;
  for (int id : order) {
    const Spec& s = specs[static_cast<size_t>(id)];
    const int64_t n = aligned(s.size);
    for (int64_t cand = 0;; cand += alignment) {
      bool ok = true;
      for (int o : done) {
        const Spec& t = specs[static_cast<size_t>(o)];
        const int64_t m = aligned(t.size);
        const bool live_together = s.first <= t.last && t.first <= s.last;
        const int64_t to = off[static_cast<size_t>(o)];
        if (live_together && n > 0 && m > 0 && cand < to + m && to < cand + n) {
          ok = false;
          break;
        }
      }
      if (ok) {
        off[static_cast<size_t>(id)] = cand;
        break;
      }
    }
    done.push_back(id);
  }
  return off;
}

TEST(Planner, RandomInstancesSatisfyInvariants) {
  std::mt19937 rng(20240531);
  const int64_t alignments[] = {1, 16, 64, 100};
  int instances = 0, cross_checked = 0, all_conflicting = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t alignment = alignments[trial % 4];
    const int n = std::uniform_int_distribution<int>(0, 40)(rng);
    const int kernels = std::uniform_int_distribution<int>(1, 30)(rng);
    // Mix of size regimes: tiny (alignment-dominated), moderate, and (in every third trial)
    // power-of-two sizes up to 1 GiB, which the brute-force cross-check below cannot afford.
    const bool huge = trial % 3 == 0;
    std::vector<Spec> specs;
    ArenaPlanner p(alignment);
    for (int i = 0; i < n; ++i) {
      int64_t size;
      switch (rng() % (huge ? 4 : 3)) {
        case 0: size = std::uniform_int_distribution<int64_t>(0, 3)(rng); break;
        case 1: size = std::uniform_int_distribution<int64_t>(0, 300)(rng); break;
        case 2: size = std::uniform_int_distribution<int64_t>(1, 10000)(rng); break;
        default: size = int64_t{1} << std::uniform_int_distribution<int>(0, 30)(rng); break;
      }
      const int first = std::uniform_int_distribution<int>(0, kernels - 1)(rng);
      const int len = (rng() % 3 == 0) ? std::uniform_int_distribution<int>(0, kernels)(rng)
                                       : std::uniform_int_distribution<int>(0, 3)(rng);
      specs.push_back({size, first, first + len});
      ASSERT_EQ(p.add_buffer(size, first, first + len), i);
    }
    p.plan();
    ++instances;

    std::string why;
    ASSERT_TRUE(p.check(&why)) << "trial " << trial << ": " << why << "\n" << p.describe();
    EXPECT_GE(p.arena_size(), p.lower_bound()) << "trial " << trial;
    EXPECT_LE(p.arena_size(), p.total_bytes()) << "trial " << trial;
    EXPECT_EQ(p.arena_size() % alignment, 0) << "trial " << trial;
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(p.offset(i) % alignment, 0);
      EXPECT_EQ(p.buffer_size(i), specs[static_cast<size_t>(i)].size);
      EXPECT_EQ(p.first(i), specs[static_cast<size_t>(i)].first);
      EXPECT_EQ(p.last(i), specs[static_cast<size_t>(i)].last);
    }

    // Brute-force cross-check of the placement rule on instances with small arenas.
    if (p.total_bytes() / alignment <= 50000) {
      ++cross_checked;
      const std::vector<int64_t> ref = reference_plan(specs, alignment);
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(p.offset(i), ref[static_cast<size_t>(i)])
            << "trial " << trial << " buffer " << i << "\n" << p.describe();
      }
    }

    // If some kernel index lies in every lifetime, every buffer conflicts with every other:
    // nothing can be shared, so the plan is exactly the sum and meets both bounds.
    if (n > 0) {
      int max_first = 0, min_last = specs[0].last;
      for (const Spec& s : specs) {
        max_first = std::max(max_first, s.first);
        min_last = std::min(min_last, s.last);
      }
      if (max_first <= min_last) {
        ++all_conflicting;
        EXPECT_EQ(p.arena_size(), p.total_bytes()) << "trial " << trial;
        EXPECT_EQ(p.lower_bound(), p.total_bytes()) << "trial " << trial;
      }
    }
  }
  EXPECT_EQ(instances, 3000);
  // Make sure the cross-checks above actually ran on a good share of the instances.
  EXPECT_GT(cross_checked, 1000);
  EXPECT_GT(all_conflicting, 50);
  std::printf("[ info     ] %d instances, %d cross-checked against brute force, %d fully "
              "conflicting\n", instances, cross_checked, all_conflicting);
}

// check() against a naive all-pairs predicate on deliberately corrupted plans: random aligned
// offsets inside the arena, so a good share of them overlap and some do not.
TEST(Planner, CheckAgreesWithNaivePredicate) {
  std::mt19937 rng(4242);
  int caught = 0, clean = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    ArenaPlanner p(16);
    const int n = std::uniform_int_distribution<int>(2, 12)(rng);
    for (int i = 0; i < n; ++i) {
      const int first = std::uniform_int_distribution<int>(0, 10)(rng);
      p.add_buffer(std::uniform_int_distribution<int64_t>(0, 100)(rng), first,
                   first + std::uniform_int_distribution<int>(0, 4)(rng));
    }
    p.plan();
    ASSERT_TRUE(p.check());
    const int64_t slots = p.arena_size() / 16;
    const int moved = std::uniform_int_distribution<int>(0, n - 1)(rng);
    const int64_t max_slot = std::max<int64_t>(0, slots - p.aligned_size(moved) / 16);
    p.set_offset_for_testing(moved, 16 * std::uniform_int_distribution<int64_t>(0, max_slot)(rng));

    bool expect_ok = true;
    for (int i = 0; i < n && expect_ok; ++i) {
      for (int j = i + 1; j < n; ++j) {
        const bool live = p.first(i) <= p.last(j) && p.first(j) <= p.last(i);
        const int64_t a = p.offset(i), na = p.aligned_size(i);
        const int64_t b = p.offset(j), nb = p.aligned_size(j);
        if (live && na > 0 && nb > 0 && a < b + nb && b < a + na) {
          expect_ok = false;
          break;
        }
      }
    }
    std::string why;
    ASSERT_EQ(p.check(&why), expect_ok) << "trial " << trial << ": " << why << "\n"
                                        << p.describe();
    (expect_ok ? clean : caught)++;
  }
  EXPECT_GT(caught, 200);
  EXPECT_GT(clean, 200);
}

// With equal sizes the greedy order is by start time, i.e. first-fit interval colouring in
// start order, which is optimal: the arena equals the lower bound.
TEST(Planner, EqualSizesAreOptimal) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 1000; ++trial) {
    ArenaPlanner p(64);
    const int n = std::uniform_int_distribution<int>(1, 60)(rng);
    const int64_t size = std::uniform_int_distribution<int64_t>(1, 500)(rng);
    for (int i = 0; i < n; ++i) {
      const int first = std::uniform_int_distribution<int>(0, 40)(rng);
      p.add_buffer(size, first, first + std::uniform_int_distribution<int>(0, 8)(rng));
    }
    p.plan();
    ASSERT_TRUE(p.check());
    ASSERT_EQ(p.arena_size(), p.lower_bound()) << "trial " << trial << "\n" << p.describe();
  }
}

// A chain like a plain feed-forward network: buffer i is written by kernel i and read by
// kernel i + 1. Two buffers are live at a time, so the arena is the largest adjacent pair.
TEST(Planner, FeedForwardChain) {
  ArenaPlanner p(64);
  const std::vector<int64_t> sizes = {4096, 8192, 8192, 2048, 16384, 1024, 64};
  for (size_t i = 0; i < sizes.size(); ++i) {
    p.add_buffer(sizes[i], static_cast<int>(i), static_cast<int>(i) + 1);
  }
  p.plan();
  EXPECT_TRUE(p.check());
  EXPECT_EQ(p.lower_bound(), 16384 + 2048);
  EXPECT_EQ(p.arena_size(), p.lower_bound()) << p.describe();
}

}  // namespace

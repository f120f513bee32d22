// Arena planner: assigns every intermediate buffer of a compiled program an offset inside one
// contiguous scratch arena, so that buffers that are never live at the same time share memory.
//
// Model
// -----
// The program is a straight-line sequence of kernels, numbered 0, 1, 2, ... A buffer is written
// by kernel `first` and last read by kernel `last`; it is *live* at every kernel index t with
// first <= t <= last (inclusive at both ends: the kernel that reads a buffer for the last time
// must still see its contents, and the kernel that writes it needs the space while it runs).
// Two buffers *conflict* when their lifetimes intersect, i.e. a.first <= b.last and
// b.first <= a.last. Conflicting buffers must occupy disjoint byte ranges of the arena; buffers
// that do not conflict may overlap freely.
//
// Every buffer reserves its size rounded up to `alignment` bytes (its *aligned size*) and every
// offset is a multiple of `alignment`, so each buffer starts on an aligned address provided the
// arena itself is aligned. A buffer of size 0 reserves nothing: it is placed at offset 0 and
// never conflicts in memory with anything (an empty range overlaps no range).
//
// Algorithm (greedy by size, in the spirit of tflite-micro's GreedyMemoryPlanner)
// ------------------------------------------------------------------------------
//   1. Order the buffers by size descending; ties go to the buffer with the earlier `first`,
//      then to the lower id. The order is total, so the plan is deterministic.
//   2. Place the buffers one at a time in that order. For the buffer being placed, walk the
//      already placed buffers in increasing offset order, skipping those whose lifetime does
//      not intersect its own. Keep a candidate offset `cand`, starting at 0: if the next
//      conflicting buffer starts at or after cand + size, the gap before it fits and we stop;
//      otherwise cand moves to the end of that buffer (if that is further). When the walk ends
//      the buffer goes at `cand`. Because the walk is in offset order this is the *lowest*
//      aligned offset at which the buffer overlaps no conflicting, already placed buffer.
//   3. The arena size is the largest offset + aligned size over all buffers.
//
// The placed buffers are kept in a vector sorted by offset, so placing n buffers costs O(n^2)
// in the worst case (fine for the thousands of buffers a real model has) and O(n log n) for the
// initial sort.
//
// Invariants after plan() (verified by check()):
//   * every offset is a non-negative multiple of alignment;
//   * offset + aligned size <= arena_size() for every buffer;
//   * no two conflicting buffers overlap in memory;
//   * lower_bound() <= arena_size() <= total_bytes(), and arena_size() % alignment == 0.
// The lower bound holds for any valid plan: at the busiest kernel index all live buffers are
// pairwise conflicting, so their aligned sizes must fit side by side. The upper bound holds for
// the greedy plan by induction: a buffer is placed either at 0 or at the end of a buffer placed
// before it, so its end is at most the summed aligned sizes of all buffers placed so far.
//
// Greedy is not optimal in general (the problem is NP-hard: it is dynamic storage allocation),
// but it is simple, deterministic and in practice close to lower_bound() for neural-network
// activation graphs, where a few large tensors dominate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chroma::memory {

class ArenaPlanner {
 public:
  // `alignment` is the byte alignment of every offset and the granule of every reservation.
  // It must be positive (it need not be a power of two); otherwise std::invalid_argument.
  explicit ArenaPlanner(int64_t alignment = 64);

  // Registers a buffer of `size_bytes` bytes (>= 0; 0 is allowed) live from kernel `first` to
  // kernel `last` inclusive (0 <= first <= last). Returns its id: 0, 1, 2, ... in call order.
  // Throws std::invalid_argument, naming the offending values, on a negative size, a negative
  // `first`, or first > last. Adding a buffer discards any previous plan.
  int add_buffer(int64_t size_bytes, int first, int last);

  // Computes offsets for all buffers (see the algorithm above). May be called again; calling
  // it twice gives the same plan.
  void plan();

  // True once plan() has run and no buffer was added since.
  bool planned() const { return planned_; }

  // Offset of buffer `id` in the arena. Throws std::out_of_range for an unknown id and
  // std::logic_error if plan() has not run.
  int64_t offset(int id) const;

  // Bytes of arena the plan needs: max over buffers of offset + aligned size (0 with no
  // buffers). Always a multiple of alignment. Throws std::logic_error if plan() has not run.
  int64_t arena_size() const;

  // Max over kernel indices t of the summed aligned sizes of the buffers live at t. No valid
  // plan can use a smaller arena. Does not need plan().
  int64_t lower_bound() const;

  // Sum of all aligned sizes: what giving every buffer its own memory would cost. Does not
  // need plan().
  int64_t total_bytes() const;

  int64_t alignment() const { return alignment_; }
  size_t size() const { return buffers_.size(); }

  // Accessors for the registered buffers; throw std::out_of_range for an unknown id.
  int64_t buffer_size(int id) const;     // as given to add_buffer (not rounded)
  int64_t aligned_size(int id) const;    // rounded up to a multiple of alignment
  int first(int id) const;
  int last(int id) const;

  // Verifies the invariants listed above: true iff plan() has run, every offset is aligned
  // and non-negative, every buffer lies inside [0, arena_size()), and no two buffers whose
  // lifetimes intersect overlap in memory. On failure, if `why` is non-null, it receives a
  // human-readable reason naming the offending buffer or pair. O(n^2) in the worst case.
  bool check(std::string* why = nullptr) const;

  // ASCII picture of the plan, for debugging and for the artifact's build report:
  //   * a map with one row per kernel index (consecutive kernel indices with the same live set
  //     are merged into one row labelled "a..b"); the row is `width` columns spanning the
  //     arena's bytes, each column showing the letter of the live buffer covering most of its
  //     byte range ('.' where nothing live is). Buffer id i is drawn as the i-th character of
  //     "a..zA..Z0..9", cycling for ids >= 62;
  //   * a table id / size / aligned / offset / first / last;
  //   * the summary line arena_size, lower_bound, total (and the saving over total).
  // Works before plan() too (then there is no map and offsets show as '-').
  std::string describe(int width = 64) const;

  // Test-only seam: overwrites the offset of buffer `id` without any validation, so tests can
  // build an invalid plan and make sure check() catches it. Requires plan() to have run.
  // arena_size() is not recomputed. Never use it outside tests.
  void set_offset_for_testing(int id, int64_t offset);

 private:
  struct Buffer {
    int64_t size;          // requested bytes
    int64_t aligned;       // size rounded up to alignment_
    int first;             // first kernel index (inclusive)
    int last;              // last kernel index (inclusive)
    int64_t offset = -1;   // assigned by plan(); -1 before
  };

  const Buffer& at(int id) const;     // bounds-checked access (std::out_of_range)
  void require_planned(const char* what) const;

  int64_t alignment_;
  std::vector<Buffer> buffers_;
  int64_t arena_size_ = 0;
  bool planned_ = false;
};

}  // namespace chroma::memory

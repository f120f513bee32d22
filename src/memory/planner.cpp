// Greedy arena planner; see planner.h for the algorithm and its invariants.
#include "memory/planner.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace chroma::memory {

namespace {

// Half-open byte ranges [a, a + na) and [b, b + nb) overlap. Empty ranges overlap nothing.
bool ranges_overlap(int64_t a, int64_t na, int64_t b, int64_t nb) {
  return na > 0 && nb > 0 && a < b + nb && b < a + na;
}

bool lifetimes_intersect(int first_a, int last_a, int first_b, int last_b) {
  return first_a <= last_b && first_b <= last_a;
}

// Character used to draw buffer `id` in describe().
char id_char(size_t id) {
  static constexpr std::string_view kChars =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  return kChars[id % kChars.size()];
}

}  // namespace

ArenaPlanner::ArenaPlanner(int64_t alignment) : alignment_(alignment) {
  if (alignment <= 0) {
    throw std::invalid_argument("ArenaPlanner: alignment must be positive, got " +
                                std::to_string(alignment));
  }
}

int ArenaPlanner::add_buffer(int64_t size_bytes, int first, int last) {
  if (size_bytes < 0) {
    throw std::invalid_argument("ArenaPlanner::add_buffer: negative size " +
                                std::to_string(size_bytes));
  }
  if (size_bytes > std::numeric_limits<int64_t>::max() - alignment_) {
    throw std::invalid_argument("ArenaPlanner::add_buffer: size " + std::to_string(size_bytes) +
                                " too large");
  }
  if (first < 0) {
    throw std::invalid_argument("ArenaPlanner::add_buffer: negative first kernel index " +
                                std::to_string(first));
  }
  if (first > last) {
    throw std::invalid_argument("ArenaPlanner::add_buffer: first (" + std::to_string(first) +
                                ") > last (" + std::to_string(last) + ")");
  }
  if (buffers_.size() >= static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw std::length_error("ArenaPlanner::add_buffer: too many buffers");
  }
  Buffer b;
  b.size = size_bytes;
  b.aligned = (size_bytes + alignment_ - 1) / alignment_ * alignment_;
  b.first = first;
  b.last = last;
  buffers_.push_back(b);
  planned_ = false;
  arena_size_ = 0;
  return static_cast<int>(buffers_.size() - 1);
}

void ArenaPlanner::plan() {
  const size_t n = buffers_.size();

  // 1. Placement order: size descending, then earlier first, then lower id.
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const Buffer& x = buffers_[static_cast<size_t>(a)];
    const Buffer& y = buffers_[static_cast<size_t>(b)];
    if (x.size != y.size) return x.size > y.size;
    if (x.first != y.first) return x.first < y.first;
    return a < b;
  });

  // 2. Place greedily. `placed` holds the ids placed so far, sorted by offset (ties keep
  //    insertion order, which does not matter for correctness).
  std::vector<int> placed;
  placed.reserve(n);
  int64_t arena = 0;
  for (int id : order) {
    Buffer& b = buffers_[static_cast<size_t>(id)];
    int64_t cand = 0;
    if (b.aligned > 0) {
      for (int other_id : placed) {
        const Buffer& o = buffers_[static_cast<size_t>(other_id)];
        if (o.aligned == 0 || !lifetimes_intersect(b.first, b.last, o.first, o.last)) continue;
        // `placed` is sorted by offset, so once a conflicting buffer starts at or after the
        // end of the candidate range, every later one does too: the gap fits.
        if (o.offset >= cand + b.aligned) break;
        cand = std::max(cand, o.offset + o.aligned);
      }
    }
    b.offset = cand;
    arena = std::max(arena, cand + b.aligned);
    auto pos = std::upper_bound(placed.begin(), placed.end(), cand, [&](int64_t off, int pid) {
      return off < buffers_[static_cast<size_t>(pid)].offset;
    });
    placed.insert(pos, id);
  }

  // 3. Every offset and aligned size is a multiple of the alignment, so `arena` is too.
  arena_size_ = arena;
  planned_ = true;
}

const ArenaPlanner::Buffer& ArenaPlanner::at(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= buffers_.size()) {
    throw std::out_of_range("ArenaPlanner: unknown buffer id " + std::to_string(id) + " (have " +
                            std::to_string(buffers_.size()) + ")");
  }
  return buffers_[static_cast<size_t>(id)];
}

void ArenaPlanner::require_planned(const char* what) const {
  if (!planned_) {
    throw std::logic_error(std::string("ArenaPlanner::") + what + ": plan() has not run");
  }
}

int64_t ArenaPlanner::offset(int id) const {
  const Buffer& b = at(id);
  require_planned("offset");
  return b.offset;
}

int64_t ArenaPlanner::arena_size() const {
  require_planned("arena_size");
  return arena_size_;
}

int64_t ArenaPlanner::lower_bound() const {
  // Sweep over lifetime events: +aligned at `first`, -aligned at `last + 1`. The live sum is
  // measured after all events of one kernel index have been applied.
  std::vector<std::pair<int64_t, int64_t>> events;  // (kernel index, delta)
  events.reserve(2 * buffers_.size());
  for (const Buffer& b : buffers_) {
    if (b.aligned == 0) continue;
    events.emplace_back(b.first, b.aligned);
    events.emplace_back(static_cast<int64_t>(b.last) + 1, -b.aligned);
  }
  std::sort(events.begin(), events.end());
  int64_t live = 0, best = 0;
  for (size_t i = 0; i < events.size();) {
    const int64_t t = events[i].first;
    for (; i < events.size() && events[i].first == t; ++i) live += events[i].second;
    best = std::max(best, live);
  }
  return best;
}

int64_t ArenaPlanner::total_bytes() const {
  int64_t total = 0;
  for (const Buffer& b : buffers_) total += b.aligned;
  return total;
}

int64_t ArenaPlanner::buffer_size(int id) const { return at(id).size; }
int64_t ArenaPlanner::aligned_size(int id) const { return at(id).aligned; }
int ArenaPlanner::first(int id) const { return at(id).first; }
int ArenaPlanner::last(int id) const { return at(id).last; }

bool ArenaPlanner::check(std::string* why) const {
  auto fail = [&](const std::string& msg) {
    if (why) *why = msg;
    return false;
  };
  if (!planned_) return fail("plan() has not run");
  const size_t n = buffers_.size();
  for (size_t i = 0; i < n; ++i) {
    const Buffer& b = buffers_[i];
    const std::string name = "buffer " + std::to_string(i);
    if (b.offset < 0) return fail(name + " has negative offset " + std::to_string(b.offset));
    if (b.offset % alignment_ != 0) {
      return fail(name + " offset " + std::to_string(b.offset) + " is not a multiple of " +
                  std::to_string(alignment_));
    }
    if (b.offset > arena_size_ - b.aligned) {
      return fail(name + " [" + std::to_string(b.offset) + ", " +
                  std::to_string(b.offset + b.aligned) + ") exceeds arena size " +
                  std::to_string(arena_size_));
    }
  }
  // Pairwise overlap test. Sorting by offset lets the inner loop stop as soon as a buffer
  // starts past the end of the current one.
  std::vector<size_t> by_offset(n);
  std::iota(by_offset.begin(), by_offset.end(), size_t{0});
  std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) {
    return buffers_[a].offset < buffers_[b].offset;
  });
  for (size_t x = 0; x < n; ++x) {
    const size_t i = by_offset[x];
    const Buffer& a = buffers_[i];
    if (a.aligned == 0) continue;
    for (size_t y = x + 1; y < n; ++y) {
      const size_t j = by_offset[y];
      const Buffer& b = buffers_[j];
      if (b.offset >= a.offset + a.aligned) break;
      if (ranges_overlap(a.offset, a.aligned, b.offset, b.aligned) &&
          lifetimes_intersect(a.first, a.last, b.first, b.last)) {
        const size_t lo = std::min(i, j), hi = std::max(i, j);
        const Buffer& p = buffers_[lo];
        const Buffer& q = buffers_[hi];
        return fail("buffers " + std::to_string(lo) + " and " + std::to_string(hi) +
                    " overlap: bytes [" + std::to_string(p.offset) + ", " +
                    std::to_string(p.offset + p.aligned) + ") vs [" + std::to_string(q.offset) +
                    ", " + std::to_string(q.offset + q.aligned) + "), kernels [" +
                    std::to_string(p.first) + ", " + std::to_string(p.last) + "] vs [" +
                    std::to_string(q.first) + ", " + std::to_string(q.last) + "]");
      }
    }
  }
  return true;
}

std::string ArenaPlanner::describe(int width) const {
  std::ostringstream os;
  const size_t n = buffers_.size();
  if (width < 1) width = 1;

  // Map: rows of kernel indices, columns of arena bytes.
  if (!planned_) {
    os << "(not planned)\n";
  } else if (n == 0) {
    os << "(no buffers)\n";
  } else {
    int t_min = buffers_[0].first, t_max = buffers_[0].last;
    for (const Buffer& b : buffers_) {
      t_min = std::min(t_min, b.first);
      t_max = std::max(t_max, b.last);
    }
    // The live set only changes at a `first` or at a `last + 1`; between two such boundaries
    // every row is identical and is printed once.
    std::vector<int64_t> cuts;
    cuts.reserve(2 * n);
    for (const Buffer& b : buffers_) {
      cuts.push_back(b.first);
      cuts.push_back(static_cast<int64_t>(b.last) + 1);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());

    const int64_t arena = std::max<int64_t>(arena_size_, 1);
    const size_t cols = static_cast<size_t>(width);
    // Byte range of column c: [c * arena / cols, (c + 1) * arena / cols), computed without
    // overflow for arenas up to ~2^63 / width bytes via long double.
    auto col_begin = [&](size_t c) {
      return static_cast<int64_t>(static_cast<long double>(arena) * static_cast<long double>(c) /
                                  static_cast<long double>(cols));
    };
    os << "arena map (" << arena_size_ << " bytes, " << width << " columns, "
       << "'.' = free):\n";
    std::vector<int64_t> best_cover(cols);
    std::string row(cols, '.');
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int64_t t0 = cuts[k], t1 = cuts[k + 1] - 1;  // rows t0..t1 share one live set
      if (t0 < t_min || t0 > t_max) continue;
      std::fill(row.begin(), row.end(), '.');
      std::fill(best_cover.begin(), best_cover.end(), 0);
      for (size_t i = 0; i < n; ++i) {
        const Buffer& b = buffers_[i];
        if (b.first > t0 || b.last < t0 || b.aligned == 0) continue;
        // Columns this buffer touches; keep, per column, the buffer covering the most bytes.
        const int64_t lo = b.offset, hi = b.offset + b.aligned;
        for (size_t c = 0; c < cols; ++c) {
          const int64_t c0 = col_begin(c), c1 = std::max(col_begin(c + 1), c0 + 1);
          const int64_t cover = std::min(hi, c1) - std::max(lo, c0);
          if (cover > best_cover[c]) {
            best_cover[c] = cover;
            row[c] = id_char(i);
          }
        }
      }
      std::string label = t0 == t1 ? std::to_string(t0)
                                   : std::to_string(t0) + ".." + std::to_string(t1);
      char prefix[32];
      std::snprintf(prefix, sizeof prefix, "%9s |", label.c_str());
      os << prefix << row << "|\n";
    }
  }

  // Table.
  os << "   id  chr          size       aligned        offset   first    last\n";
  for (size_t i = 0; i < n; ++i) {
    const Buffer& b = buffers_[i];
    char line[160];
    std::snprintf(line, sizeof line, "%5zu    %c %13lld %13lld %13s %7d %7d\n", i, id_char(i),
                  static_cast<long long>(b.size), static_cast<long long>(b.aligned),
                  planned_ ? std::to_string(b.offset).c_str() : "-", b.first, b.last);
    os << line;
  }

  // Summary.
  const int64_t total = total_bytes();
  os << "arena_size=";
  if (planned_) {
    os << arena_size_;
  } else {
    os << '-';
  }
  os << " lower_bound=" << lower_bound() << " total=" << total << " alignment=" << alignment_;
  if (planned_ && total > 0) {
    const double saved = 100.0 * (1.0 - static_cast<double>(arena_size_) /
                                            static_cast<double>(total));
    char buf[64];
    std::snprintf(buf, sizeof buf, " (saves %.1f%% vs total)", saved);
    os << buf;
  }
  os << '\n';
  return os.str();
}

void ArenaPlanner::set_offset_for_testing(int id, int64_t offset) {
  at(id);  // bounds check
  require_planned("set_offset_for_testing");
  buffers_[static_cast<size_t>(id)].offset = offset;
}

}  // namespace chroma::memory

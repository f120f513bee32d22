// chroma::simt: a CPU SIMT emulator for the generated CUDA and Metal kernels (docs/cuda.md,
// "The emulator"). The emitted kernel text compiles as C++ against a small header of
// builtins (simt/cuda.h; simt/metal.h for MSL) and runs here: each workgroup's invocations are
// fibers on the calling thread, run one after another until they reach a rendezvous point:
//
// - a workgroup barrier: every invocation of the group must arrive at the same barrier (the
//   same source line); one that returns or waits at another barrier is divergent control flow
//   around a barrier, undefined behaviour on every GPU API, and aborts with a message naming
//   the sites;
// - a subgroup operation (shuffle, reduction, ballot): the 32 invocations of the subgroup
//   exchange values; all 32 must take part (the generated kernels only use whole subgroups).
//
// Shared (workgroup) memory is one copy per running workgroup; atomics are plain operations
// (one fiber runs at a time). `Options::reverse` starts each round with the last invocation
// instead of the first: a kernel that reads another invocation's shared-memory write without
// a barrier between them gets a different answer in one of the two orders.
//
// Nothing here is fast (a fiber switch per invocation per barrier); it exists so that every
// generated kernel runs, and is checked, on machines without a GPU.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace chroma::simt {

inline constexpr int kSubgroup = 32;

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  unsigned count() const { return x * y * z; }
};

struct Options {
  bool reverse = false;            // run each round's invocations last to first
  size_t stack_bytes = 256 << 10;  // per invocation (generated kernels keep small private arrays)
};

[[noreturn]] inline void fail(const std::string& msg) {
  std::fprintf(stderr, "chroma simt emulator: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace detail {

enum class Wait : uint8_t { kNone, kBarrier, kSubgroup, kDone };

struct Lane {
  ucontext_t ctx{};
  std::unique_ptr<char[]> stack;
  Dim3 tid;
  Wait wait = Wait::kNone;
  int site = 0;        // source line of the barrier or subgroup operation it waits at
  uint64_t value = 0;  // a subgroup operation's operand (bits), then its result
  int src = 0;         // the lane it reads (shuffles)
};

// How the last of a subgroup's 32 arrivals combines their operands: called once, with every
// lane's `value` and `src` set; writes each lane's result into `value`.
using Combine = void (*)(Lane* lanes, int n);

struct Group {
  std::vector<Lane> lanes;
  Dim3 block, grid, bid;
  ucontext_t sched{};
  int current = -1;
  const std::function<void()>* body = nullptr;
  std::vector<Combine> pending;  // per subgroup: the operation its first arrival named
};

inline thread_local Group* g_group = nullptr;

inline void trampoline() {
  Group* g = g_group;
  (*g->body)();
  g->lanes[static_cast<size_t>(g->current)].wait = Wait::kDone;
  swapcontext(&g->lanes[static_cast<size_t>(g->current)].ctx, &g->sched);
}

inline Lane& self() {
  if (!g_group || g_group->current < 0) fail("a kernel builtin was used outside an emulated launch");
  return g_group->lanes[static_cast<size_t>(g_group->current)];
}

inline void yield_to_scheduler() {
  Group* g = g_group;
  swapcontext(&g->lanes[static_cast<size_t>(g->current)].ctx, &g->sched);
}

inline std::string where(const Group& g) {
  return "workgroup (" + std::to_string(g.bid.x) + "," + std::to_string(g.bid.y) + "," + std::to_string(g.bid.z) + ")";
}

// Runs one workgroup to completion: rounds of "every invocation that can run, runs until it
// waits or returns", then whichever rendezvous is complete is released.
inline void run_group(Group& g, const Options& opt) {
  const int n = static_cast<int>(g.lanes.size());
  const int subgroups = (n + kSubgroup - 1) / kSubgroup;
  g.pending.assign(static_cast<size_t>(subgroups), nullptr);
  for (int i = 0; i < n; ++i) {
    Lane& l = g.lanes[static_cast<size_t>(i)];
    l.wait = Wait::kNone;
    if (!l.stack) l.stack.reset(new char[opt.stack_bytes]);
    getcontext(&l.ctx);
    l.ctx.uc_stack.ss_sp = l.stack.get();
    l.ctx.uc_stack.ss_size = opt.stack_bytes;
    l.ctx.uc_link = nullptr;
    makecontext(&l.ctx, &trampoline, 0);
  }
  for (;;) {
    for (int k = 0; k < n; ++k) {
      const int i = opt.reverse ? n - 1 - k : k;
      if (g.lanes[static_cast<size_t>(i)].wait != Wait::kNone) continue;
      g.current = i;
      swapcontext(&g.sched, &g.lanes[static_cast<size_t>(i)].ctx);
    }
    g.current = -1;
    int done = 0, at_barrier = 0, at_subgroup = 0;
    for (const Lane& l : g.lanes) {
      done += l.wait == Wait::kDone;
      at_barrier += l.wait == Wait::kBarrier;
      at_subgroup += l.wait == Wait::kSubgroup;
    }
    if (done == n) return;
    if (at_barrier == n) {
      const int site = g.lanes[0].site;
      for (const Lane& l : g.lanes) {
        if (l.site != site) {
          fail(where(g) + ": invocations wait at different barriers (lines " + std::to_string(site) + " and " +
               std::to_string(l.site) + "): a barrier in divergent control flow");
        }
      }
      for (Lane& l : g.lanes) l.wait = Wait::kNone;
      continue;
    }
    // Subgroups whose 32 invocations all wait at one subgroup operation are released (the
    // last arrival already combined their operands).
    bool released = false;
    for (int s = 0; s < subgroups; ++s) {
      const int b = s * kSubgroup, e = std::min(n, b + kSubgroup);
      bool all = true;
      for (int i = b; i < e; ++i) all = all && g.lanes[static_cast<size_t>(i)].wait == Wait::kSubgroup;
      if (!all) continue;
      for (int i = b; i < e; ++i) g.lanes[static_cast<size_t>(i)].wait = Wait::kNone;
      released = true;
    }
    if (released) continue;
    // Nothing can run: some invocations returned or wait elsewhere while others wait at a
    // barrier or for their subgroup.
    std::string msg = where(g) + ": deadlock, a barrier or subgroup operation in divergent control flow (";
    int shown = 0;
    for (int i = 0; i < n && shown < 4; ++i) {
      const Lane& l = g.lanes[static_cast<size_t>(i)];
      const char* what = l.wait == Wait::kDone ? "returned" : l.wait == Wait::kBarrier ? "waits at the barrier of line "
                                                                                          : "waits at the subgroup operation of line ";
      if (i > 0 && l.wait == g.lanes[static_cast<size_t>(i - 1)].wait && l.site == g.lanes[static_cast<size_t>(i - 1)].site) continue;
      msg += (shown++ ? "; " : "") + std::string("invocation ") + std::to_string(i) + " " + what +
             (l.wait == Wait::kDone ? "" : std::to_string(l.site));
    }
    fail(msg + ")");
  }
}

}  // namespace detail

// --- storage slots: every global access bounded ---
//
// The generated kernels index their storage slots with words computed from the dispatch's
// parameters (`s1[p0 + i]`). A package's parameters are data, not code: a package that points
// them past a buffer must not reach another allocation of the process. On a GPU the memory
// protection stops such an access; here each slot is a Slot (the dialect prints its type as
// CHROMA_SLOT(T), a plain pointer for nvcc and Metal), whose index is checked: an access
// outside the buffer reads and writes a scratch word instead, and the first such access of a
// launch is recorded for the launcher to report (chroma_simt_launch returns kSlotFault).

constexpr int kSlotFault = -2;

struct SlotFault {
  bool set = false;
  int slot = 0;
  long long index = 0;
  uint64_t words = 0;
};
inline thread_local SlotFault g_slot_fault;

namespace detail {
template <class T>
T& out_of_bounds(int slot, long long index, uint64_t words) {
  if (!g_slot_fault.set) g_slot_fault = SlotFault{true, slot, index, words};
  static thread_local std::remove_const_t<T> scratch;
  scratch = {};
  return scratch;
}
}  // namespace detail

template <class T>
struct Slot {
  T* base = nullptr;
  uint64_t words = 0;
  int slot = 0;
  template <class I>
  T& operator[](I i) const {
    const long long k = static_cast<long long>(i);
    if (k < 0 || static_cast<uint64_t>(k) >= words) return detail::out_of_bounds<T>(slot, k, words);
    return base[k];
  }
};

// What the launcher passes for a slot; becomes the kernel's Slot<unsigned> or Slot<const unsigned>.
struct SlotArg {
  unsigned* base;
  uint64_t words;
  int slot;
  template <class T>
  operator Slot<T>() const {  // NOLINT(google-explicit-constructor): the kernel's parameter type
    return Slot<T>{base, words, slot};
  }
};

// Runs `kernel` (a callable taking no arguments that runs one invocation: it reads its ids
// through the builtins) over grid x block invocations.
inline void launch(Dim3 grid, Dim3 block, const std::function<void()>& kernel, const Options& opt = {}) {
  if (block.count() == 0 || block.count() > 1024) fail("workgroup size " + std::to_string(block.count()) + " (1..1024)");
  detail::Group g;
  g.block = block;
  g.grid = grid;
  g.body = &kernel;
  g.lanes.resize(block.count());
  for (unsigned i = 0; i < block.count(); ++i) {
    g.lanes[i].tid = Dim3{i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
  }
  detail::Group* outer = detail::g_group;
  if (outer) fail("a launch from inside a kernel");
  detail::g_group = &g;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        g.bid = Dim3{x, y, z};
        detail::run_group(g, opt);
      }
  detail::g_group = nullptr;
}

// --- builtins the dialect headers spell ---

inline Dim3 thread_id() { return detail::self().tid; }
inline Dim3 group_id() {
  detail::self();
  return detail::g_group->bid;
}
inline Dim3 group_size() {
  detail::self();
  return detail::g_group->block;
}
inline Dim3 grid_size() {
  detail::self();
  return detail::g_group->grid;
}
inline unsigned flat_id() {
  const Dim3 t = thread_id(), b = group_size();
  return t.x + b.x * (t.y + b.y * t.z);
}
inline unsigned lane_id() { return flat_id() % kSubgroup; }

inline void barrier(int line) {
  detail::Lane& l = detail::self();
  l.wait = detail::Wait::kBarrier;
  l.site = line;
  detail::yield_to_scheduler();
}

// A subgroup rendezvous: deposits `bits` (and a source lane), waits for the other 31, returns
// this lane's result as `combine` computed it.
inline uint64_t subgroup_exchange(int line, uint64_t bits, int src, detail::Combine combine) {
  detail::Group* g = detail::g_group;
  detail::Lane& l = detail::self();
  const int me = g->current, s = me / kSubgroup, b = s * kSubgroup;
  const int e = std::min(static_cast<int>(g->lanes.size()), b + kSubgroup);
  if (e - b != kSubgroup) fail(detail::where(*g) + ": a subgroup operation in a partial subgroup (workgroup size not a multiple of 32)");
  l.value = bits;
  l.src = src;
  l.site = line;
  l.wait = detail::Wait::kSubgroup;
  if (!g->pending[static_cast<size_t>(s)]) g->pending[static_cast<size_t>(s)] = combine;
  int arrived = 0;
  for (int i = b; i < e; ++i) {
    const detail::Lane& o = g->lanes[static_cast<size_t>(i)];
    if (o.wait == detail::Wait::kSubgroup) {
      if (o.site != line) {
        fail(detail::where(*g) + ": the invocations of a subgroup wait at different subgroup operations (lines " +
             std::to_string(o.site) + " and " + std::to_string(line) + ")");
      }
      ++arrived;
    }
  }
  if (arrived == kSubgroup) {
    g->pending[static_cast<size_t>(s)](&g->lanes[static_cast<size_t>(b)], kSubgroup);
    g->pending[static_cast<size_t>(s)] = nullptr;
  }
  detail::yield_to_scheduler();
  return detail::self().value;
}

namespace detail {
template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8);
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}
template <class T, int Op>  // 0 sum, 1 min, 2 max
void reduce_lanes(Lane* lanes, int n) {
  T acc = from_bits<T>(lanes[0].value);
  for (int i = 1; i < n; ++i) {
    const T v = from_bits<T>(lanes[i].value);
    if constexpr (Op == 0) acc = static_cast<T>(acc + v);
    else if constexpr (Op == 1) acc = v < acc ? v : acc;
    else acc = acc < v ? v : acc;
  }
  for (int i = 0; i < n; ++i) lanes[i].value = to_bits(acc);
}
inline void shuffle_lanes(Lane* lanes, int n) {
  std::vector<uint64_t> in(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) in[static_cast<size_t>(i)] = lanes[i].value;
  for (int i = 0; i < n; ++i) {
    const int s = lanes[i].src;
    lanes[i].value = s >= 0 && s < n ? in[static_cast<size_t>(s)] : in[static_cast<size_t>(i)];  // out of range: own value
  }
}
inline void ballot_lanes(Lane* lanes, int n) {
  uint64_t m = 0;
  for (int i = 0; i < n; ++i) m |= (lanes[i].value ? uint64_t{1} : 0) << i;
  for (int i = 0; i < n; ++i) lanes[i].value = m;
}
}  // namespace detail

// Lane `src`'s value of v (CUDA's __shfl_sync; out-of-range sources read the lane's own value).
template <class T>
T shuffle(int line, T v, int src) {
  return detail::from_bits<T>(subgroup_exchange(line, detail::to_bits(v), src, &detail::shuffle_lanes));
}
template <class T>
T subgroup_add(int line, T v) {
  return detail::from_bits<T>(subgroup_exchange(line, detail::to_bits(v), 0, &detail::reduce_lanes<T, 0>));
}
template <class T>
T subgroup_min(int line, T v) {
  return detail::from_bits<T>(subgroup_exchange(line, detail::to_bits(v), 0, &detail::reduce_lanes<T, 1>));
}
template <class T>
T subgroup_max(int line, T v) {
  return detail::from_bits<T>(subgroup_exchange(line, detail::to_bits(v), 0, &detail::reduce_lanes<T, 2>));
}
inline uint32_t ballot(int line, bool p) {
  return static_cast<uint32_t>(subgroup_exchange(line, p ? 1 : 0, 0, &detail::ballot_lanes));
}

}  // namespace chroma::simt

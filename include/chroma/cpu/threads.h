// chroma::rt::ThreadPool: the worker threads of one loaded program.
//
// A program owns one pool of `threads - 1` workers; the calling thread is the remaining
// one and always takes part. Kernels that are worth splitting (products, convolutions,
// large elementwise and row kernels: docs/cpu_kernels.md, "Threads and the product library")
// call `parallel_for(n, fn)`: [0, n) is cut into one contiguous range per thread, so each thread
// streams its own slice; the ranges are claimed by whichever thread is free. Between jobs,
// workers spin briefly (a call runs hundreds of kernels back to back) and then sleep on a
// condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CHROMA_CPU_RELAX() _mm_pause()
#else
#define CHROMA_CPU_RELAX() ((void)0)
#endif

namespace chroma::rt {

class ThreadPool {
 public:
  using Fn = void (*)(void* arg, int64_t begin, int64_t end);

  explicit ThreadPool(int threads) : threads_(threads < 1 ? 1 : threads) {
    for (int t = 1; t < threads_; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (std::thread& w : workers_) w.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }

  // Runs fn over [0, n), cut into min(n, threads) contiguous ranges [n*r/R, n*(r+1)/R).
  // Returns when all are done. Ranges are claimed, not assigned: the calling thread takes
  // ranges until none is left, so a worker that is not running (a busy or oversubscribed
  // machine) costs at most the range it already claimed, never a wait for it to wake up.
  void run(int64_t n, Fn fn, void* arg) {
    const int use = static_cast<int>(n < threads_ ? n : threads_);
    if (use <= 1) {
      if (n > 0) fn(arg, 0, n);
      return;
    }
    uint64_t g;
    {
      std::lock_guard<std::mutex> lk(m_);
      fn_ = fn;
      arg_ = arg;
      n_ = n;
      use_ = use;
      done_.store(0, std::memory_order_relaxed);
      g = gen_.load(std::memory_order_relaxed) + 1;
      claim_.store(g << 32, std::memory_order_relaxed);
      gen_.store(g, std::memory_order_release);
    }
    cv_.notify_all();
    work_on(g, fn, arg, n, use);
    for (int spin = 0; done_.load(std::memory_order_acquire) != use; ++spin) {
      CHROMA_CPU_RELAX();
      if ((spin & 63) == 63) std::this_thread::yield();
    }
  }

  template <class F>
  void parallel_for(int64_t n, F&& f) {
    using Body = std::remove_reference_t<F>;
    run(n, [](void* a, int64_t b, int64_t e) { (*static_cast<Body*>(a))(b, e); }, static_cast<void*>(&f));
  }

 private:
  // Claims and runs ranges of job g until none is left (or a later job replaced it: the
  // claim word holds the job's generation in its high half, so a late worker cannot take a
  // range of the next job with this job's function).
  void work_on(uint64_t g, Fn fn, void* arg, int64_t n, int use) {
    for (;;) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      int r;
      do {
        if ((c >> 32) != g) return;
        r = static_cast<int>(c & 0xffffffffu);
        if (r >= use) return;
      } while (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire));
      fn(arg, n * r / use, n * (r + 1) / use);
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  void work(int) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = gen_.load(std::memory_order_acquire);
      // Spin about 50 microseconds (the next kernel of the same call usually comes
      // sooner), yielding now and then so an oversubscribed machine is not starved.
      for (int spin = 0; g == seen && spin < kSpin; ++spin) {
        CHROMA_CPU_RELAX();
        if ((spin & 63) == 63) std::this_thread::yield();
        g = gen_.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || gen_.load(std::memory_order_acquire) != seen; });
        g = gen_.load(std::memory_order_acquire);
      }
      Fn fn;
      void* arg;
      int64_t n;
      int use;
      {
        // The job and its generation are read together.
        std::lock_guard<std::mutex> lk(m_);
        if (stop_) return;
        seen = gen_.load(std::memory_order_acquire);
        fn = fn_;
        arg = arg_;
        n = n_;
        use = use_;
      }
      work_on(seen, fn, arg, n, use);
    }
  }

  static constexpr int kSpin = 2048;
  int threads_;
  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> done_{0};        // ranges of the current job finished
  std::atomic<uint64_t> claim_{0};  // (generation << 32) | next range to claim
  Fn fn_ = nullptr;
  void* arg_ = nullptr;
  int64_t n_ = 0;
  int use_ = 0;
  bool stop_ = false;
};

}  // namespace chroma::rt

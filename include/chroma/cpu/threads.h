// chroma::rt::ThreadPool: the worker threads of one loaded program.
//
// A program owns one pool of `threads - 1` workers; the calling thread is the remaining
// one and always takes part. Kernels that are worth splitting (large memory-bound matrix
// products) call `parallel_for(n, fn)`: [0, n) is cut into one contiguous range per thread,
// so each thread streams its own slice of the weights. Between jobs, workers spin briefly
// (a call runs hundreds of kernels back to back) and then sleep on a condition variable.
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

  // Runs fn over [0, n): thread t gets [n*t/T, n*(t+1)/T). Returns when all are done.
  void run(int64_t n, Fn fn, void* arg) {
    const int use = static_cast<int>(n < threads_ ? n : threads_);
    if (use <= 1) {
      if (n > 0) fn(arg, 0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> g(m_);
      fn_ = fn;
      arg_ = arg;
      n_ = n;
      use_ = use;
      pending_.store(use - 1, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    fn(arg, 0, n / use);
    for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
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
  void work(int t) {
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
        cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
        g = gen_.load(std::memory_order_acquire);
      }
      Fn fn;
      void* arg;
      int64_t n;
      int use;
      {
        // The job and its generation are read together: a job posted later can only
        // start after every participant of this one has finished.
        std::lock_guard<std::mutex> lk(m_);
        if (stop_) return;
        seen = gen_.load(std::memory_order_acquire);
        fn = fn_;
        arg = arg_;
        n = n_;
        use = use_;
      }
      if (t < use) {
        fn(arg, n * t / use, n * (t + 1) / use);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  static constexpr int kSpin = 2048;
  int threads_;
  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> pending_{0};
  Fn fn_ = nullptr;
  void* arg_ = nullptr;
  int64_t n_ = 0;
  int use_ = 0;
  bool stop_ = false;
};

}  // namespace chroma::rt

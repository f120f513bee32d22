// membw: memory read bandwidth of this machine, for bench/gpt_oss.py's floor.
//
//   g++ -O2 -march=native -pthread bench/membw.cpp -o membw
//   ./membw [MiB=1024] [passes=7] [threads=1 ...]
//
// Allocates one buffer of MiB mebibytes (written once, so every page is real), then for each
// thread count reads the whole buffer `passes` times, the threads splitting it into
// contiguous chunks, and prints one JSON object per thread count on its own line:
//   {"mib": 1024, "threads": 1, "passes_gbps": [...], "best_gbps": 23.4}
// GB/s is 1e9 bytes per second; "best" is the fastest pass (the least disturbed one).
#include <immintrin.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

volatile std::uint64_t g_sink;

// Sums 64-bit lanes with four independent accumulators; integer adds keep it exact and let
// the loads, not the adds, be the limit.
std::uint64_t read_chunk(const std::uint64_t* p, std::size_t n) {
    std::size_t i = 0;
#if defined(__AVX512F__)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 8));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 16));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 24));
    }
    alignas(64) std::uint64_t lanes[8];
    _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
    std::uint64_t s = 0;
    for (std::uint64_t v : lanes) s += v;
#elif defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
    }
    alignas(32) std::uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                       _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    std::uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
    std::uint64_t s = 0, s1 = 0, s2 = 0, s3 = 0;
    for (; i + 4 <= n; i += 4) {
        s += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    s += s1 + s2 + s3;
#endif
    for (; i < n; ++i) s += p[i];
    return s;
}

double one_pass(const std::uint64_t* buf, std::size_t words, int threads) {
    // Chunks are multiples of 64 words (512 B) so every chunk stays 64-byte aligned.
    std::size_t per = (words / threads) & ~std::size_t(63);
    std::vector<std::uint64_t> sums(threads);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t)
        pool.emplace_back([&, t] {
            std::size_t n = t == threads - 1 ? words - per * t : per;
            sums[t] = read_chunk(buf + per * t, n);
        });
    sums[0] = read_chunk(buf, threads == 1 ? words : per);
    for (auto& th : pool) th.join();
    auto t1 = std::chrono::steady_clock::now();
    std::uint64_t s = 0;
    for (auto v : sums) s += v;
    g_sink = g_sink + s;
    double sec = std::chrono::duration<double>(t1 - t0).count();
    return double(words) * sizeof(std::uint64_t) / sec / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
    int passes = argc > 2 ? std::atoi(argv[2]) : 7;
    std::vector<int> thread_counts;
    for (int a = 3; a < argc; ++a) thread_counts.push_back(std::atoi(argv[a]));
    if (thread_counts.empty()) thread_counts.push_back(1);
    if (mib == 0 || passes <= 0) {
        std::fprintf(stderr, "usage: membw [MiB=1024] [passes=7] [threads=1 ...]\n");
        return 2;
    }
    std::size_t bytes = mib << 20;
    void* mem = std::aligned_alloc(std::size_t(2) << 20, bytes);
    if (!mem) {
        std::fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    madvise(mem, bytes, MADV_HUGEPAGE);  // fewer TLB misses; ignored where unsupported
    auto* buf = static_cast<std::uint64_t*>(mem);
    std::size_t words = bytes / sizeof(std::uint64_t);
    for (std::size_t i = 0; i < words; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
    for (int threads : thread_counts) {
        if (threads < 1) threads = 1;
        one_pass(buf, words, threads);  // warm-up: thread start, page tables
        std::printf("{\"mib\": %zu, \"threads\": %d, \"passes_gbps\": [", mib, threads);
        double best = 0;
        for (int p = 0; p < passes; ++p) {
            double g = one_pass(buf, words, threads);
            if (g > best) best = g;
            std::printf("%s%.3f", p ? ", " : "", g);
        }
        std::printf("], \"best_gbps\": %.3f}\n", best);
        std::fflush(stdout);
    }
    std::free(mem);
    return 0;
}

// Memory bandwidth, the roofline of every decode figure (bench.h): STREAM-style copy and a
// read-only sum, split over the pool's threads.
#include <cstring>
#include <vector>

#include "bench/bench.h"
#include "bench/common.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {

using bench_detail::Clock;
using bench_detail::seconds_since;

Summary copy_bandwidth_gbps(ThreadPool& pool, int64_t bytes, int reps) {
  if (bytes < (1 << 20) || reps < 1) throw Error("copy bandwidth: need >= 1 MiB and >= 1 repetition");
  const int64_t n = bytes / static_cast<int64_t>(sizeof(double));
  std::vector<double> a(static_cast<size_t>(n), 1.0), b(static_cast<size_t>(n), 0.0);
  const auto copy = [&] {
    pool.parallel_for(64, [&](int64_t c0, int64_t c1) {
      const int64_t i0 = n * c0 / 64, i1 = n * c1 / 64;
      std::memcpy(b.data() + i0, a.data() + i0, static_cast<size_t>(i1 - i0) * sizeof(double));
    });
  };
  copy();  // first touch / warm-up
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    copy();
    gbps.push_back(2.0 * static_cast<double>(n * static_cast<int64_t>(sizeof(double))) / seconds_since(t0) / 1e9);
  }
  return summarize(gbps);
}

Summary read_bandwidth_gbps(ThreadPool& pool, int64_t bytes, int reps) {
  if (bytes < (1 << 20) || reps < 1) throw Error("read bandwidth: need >= 1 MiB and >= 1 repetition");
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float)) / 32 * 32;
  std::vector<float> a(static_cast<size_t>(n), 1.0f);
  std::vector<float> sums(64, 0.0f);
  const auto read = [&] {
    pool.parallel_for(64, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i0 = n * c / 64 / 32 * 32, i1 = n * (c + 1) / 64 / 32 * 32;
        float acc[32] = {};
        for (int64_t i = i0; i < i1; i += 32)
          for (int j = 0; j < 32; ++j) acc[j] += a[static_cast<size_t>(i + j)];
        float s = 0;
        for (float v : acc) s += v;
        sums[static_cast<size_t>(c)] = s;
      }
    });
  };
  read();
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    read();
    gbps.push_back(static_cast<double>(n * static_cast<int64_t>(sizeof(float))) / seconds_since(t0) / 1e9);
  }
  if (sums[0] < 0) throw Error("read bandwidth: impossible sum");  // keeps the loads alive
  return summarize(gbps);
}

}  // namespace kvevict

// A persistent worker pool with static partitioning. Idle workers spin briefly (100 us) before
// sleeping, so back-to-back calls of a decode step do not each pay a wake-up.
//
// parallel_for splits [0, n) into one contiguous range per worker. Work items must write
// disjoint outputs and compute each output in a fixed order, so results are bit-identical for
// any thread count (kvevict's determinism rule).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvevict {

/// Fixed-size pool of worker threads; the calling thread takes part as worker 0.
class ThreadPool {
 public:
  /// Starts `n_threads - 1` workers (n_threads >= 1; 0 means hardware concurrency).
  explicit ThreadPool(int n_threads = 1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of threads that run work, including the caller.
  int size() const { return n_threads_; }

  /// Calls fn(begin, end) on disjoint contiguous ranges covering [0, n); blocks until done.
  /// Exceptions thrown by fn are rethrown on the calling thread (the first one wins).
  /// `work` estimates the whole call's cost in multiply-adds or element moves (-1: unknown);
  /// below kMinParallelWork the caller runs fn(0, n) alone, because waking a worker (a futex
  /// round trip, tens of microseconds) costs more than such a call (measured: on the 0.43M-
  /// parameter default model, 2 threads without this were 2.2x slower than 1).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t work = -1);

  /// Calls below this much work (see parallel_for) run on the calling thread only: about 100 us
  /// of single-core work, several times a worker's wake-up latency.
  static constexpr int64_t kMinParallelWork = int64_t{1} << 20;

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;  // published by generation_
  int64_t job_n_ = 0;
  std::atomic<uint64_t> generation_{0};  // bumped once per parallel call
  std::atomic<int> pending_{0};          // workers still running the current call
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;  // guarded by mu_
};

}  // namespace kvevict

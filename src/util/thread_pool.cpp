#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVEVICT_PAUSE() _mm_pause()
#else
#define KVEVICT_PAUSE() ((void)0)
#endif

namespace kvevict {
namespace {

// How long a worker waiting for the next call, or the caller waiting for the workers, spins
// before sleeping on the condition variable. Decode issues a parallel call every few tens of
// microseconds (7 matmuls and one attention per layer); sleeping between them made every call
// pay a futex wake-up (SmolLM2-360M shape: 224 calls per token). 100 us of spinning bridges those
// gaps and costs at most that much CPU when the pool goes idle.
constexpr auto kSpin = std::chrono::microseconds(100);

// Spins until pred() or kSpin has passed; returns pred().
template <class Pred>
bool spin_until(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (pred()) return true;
    KVEVICT_PAUSE();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return pred();
  }
}

void run_range(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int index, int n_threads) {
  const int64_t begin = n * index / n_threads;
  const int64_t end = n * (index + 1) / n_threads;
  if (begin < end) fn(begin, end);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const auto ready = [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // job_ and job_n_ were written before generation_ was released.
    seen = generation_.load(std::memory_order_acquire);
    const auto* job = job_;
    const int64_t n = job_n_;
    try {
      run_range(*job, n, index, n_threads_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // pairs with the caller's predicate check
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t work) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1 || (work >= 0 && work < kMinParallelWork)) {
    fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  error_ = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Under the lock so a worker between its predicate check and its sleep cannot miss it.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_work_.notify_all();
  std::exception_ptr mine;
  try {
    run_range(fn, n, 0, n_threads_);
  } catch (...) {
    mine = std::current_exception();
  }
  const auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, done);
  }
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace kvevict

// A fixed pool of worker threads running parallel_for over index ranges.
// Work is split by output index only, so every reduction runs on one thread in a
// fixed order and results do not depend on the thread count.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) on disjoint ranges covering [0, n); blocks until done.
  // Ranges are multiples of `grain` (but the last).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn);

  // Threads to use when the caller passes 0: every core the process may run on.
  static int default_threads();

  // While set: once *flag is true, parallel_for hands out no more work and, when the pieces already
  // running are done, throws Interrupted, so a long op stops within one grain of a Ctrl-C. Set it
  // between jobs, from the thread that calls parallel_for.
  void set_interrupt(const std::atomic<bool>* flag) { interrupt_ = flag; }

 private:
  void worker(int idx);
  // Runs grain-sized pieces of the current job until none is left.
  void drain(const std::function<void(int64_t, int64_t, int)>& fn, int64_t n, int64_t grain, int idx);

  // The hand-off: a job is published by bumping generation_; a worker spins on it for up to kSpin before it
  // sleeps on cv_start_, and the caller spins on active_ before it sleeps on cv_done_. A step of small ops
  // (a decode step: hundreds of parallel_for calls of tens of microseconds) then pays no futex wake and
  // wait per op. The condition variables are notified only when someone sleeps (sleepers_, caller_sleeps_,
  // read after the store they wait for, both sequentially consistent: a sleeper either sees the store
  // under the mutex or is counted before the notifier looks).
  static constexpr int64_t kSpinNanos = 50'000;
  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  std::atomic<int64_t> next_{0};  // the next unclaimed index of the current job
  std::atomic<int> generation_{0}, active_{0}, sleepers_{0};
  std::atomic<bool> caller_sleeps_{false}, stop_{false};
  const std::atomic<bool>* interrupt_ = nullptr;
  bool interrupted() const { return interrupt_ && interrupt_->load(std::memory_order_relaxed); }
};

}  // namespace strata

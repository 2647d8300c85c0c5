// ThreadPool: workers pull grain-sized chunks from a shared counter.
#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "core/error.h"

namespace strata {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::default_threads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : (int)hc;
}

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() or `nanos` have passed; whether done() held.
template <class Done>
bool spin_until(Done&& done, int64_t nanos) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(nanos);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= end) return done();
  }
}

}  // namespace

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    if (!interrupt_) {
      fn(0, n, 0);
      return;
    }
    for (int64_t b = 0; b < n; b += grain) {
      if (interrupted()) throw Interrupted();
      fn(b, std::min(n, b + grain), 0);
    }
    return;
  }
  // Every worker is past the previous job (active_ reached 0), so none reads these while they change.
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  active_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);  // publishes the job
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_start_.notify_all();
  }
  // The caller works too, as thread 0.
  drain(fn, n, grain, 0);
  const auto done = [this] { return active_.load(std::memory_order_seq_cst) == 0; };
  if (!spin_until(done, kSpinNanos)) {
    std::unique_lock<std::mutex> lk(mu_);
    caller_sleeps_.store(true, std::memory_order_seq_cst);
    cv_done_.wait(lk, done);
    caller_sleeps_.store(false, std::memory_order_relaxed);
  }
  job_ = nullptr;
  if (interrupted()) throw Interrupted();
}

void ThreadPool::drain(const std::function<void(int64_t, int64_t, int)>& fn, int64_t n, int64_t grain,
                       int idx) {
  for (;;) {
    if (interrupted()) return;
    const int64_t b = next_.fetch_add(grain, std::memory_order_relaxed);
    if (b >= n) return;
    fn(b, std::min(n, b + grain), idx);
  }
}

void ThreadPool::worker(int idx) {
  int seen = 0;
  for (;;) {
    const auto ready = [&] {
      return stop_.load(std::memory_order_seq_cst) || generation_.load(std::memory_order_seq_cst) != seen;
    };
    if (!spin_until(ready, kSpinNanos)) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_start_.wait(lk, ready);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_seq_cst)) return;
    seen = generation_.load(std::memory_order_seq_cst);
    drain(*job_, job_n_, job_grain_, idx);
    if (active_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeps_.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_done_.notify_all();
    }
  }
}

}  // namespace strata

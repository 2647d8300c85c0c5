// ThreadPool: workers pull grain-sized chunks from a shared counter.
#include "core/thread_pool.h"

#include <algorithm>
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
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    next_ = 0;
    active_ = n_threads_ - 1;
    ++generation_;
  }
  cv_start_.notify_all();
  // The caller works too, as thread 0.
  drain(fn, n, grain, 0);
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [this] { return active_ == 0; });
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
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, grain;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      grain = job_grain_;
    }
    drain(*job, n, grain, idx);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--active_ == 0) cv_done_.notify_all();
    }
  }
}

}  // namespace strata

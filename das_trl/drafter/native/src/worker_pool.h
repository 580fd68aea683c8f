// A small fork-join pool for the engine step: the calling thread and `threads - 1` persistent workers split a range
// of rows into contiguous chunks, and run() returns when every chunk is done. Workers sleep on a condition variable
// between steps (vLLM runs the drafter synchronously, so the engine's own threads are idle meanwhile).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace das {

class WorkerPool {
 public:
  explicit WorkerPool(int threads) : threads_(threads < 1 ? 1 : threads) {
    for (int w = 1; w < threads_; ++w) workers_.emplace_back([this, w] { loop(w); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_start_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  // f(begin, end, worker) over [0, n) in threads() contiguous chunks (fewer when n is small). Rethrows the first
  // exception a chunk raised.
  void run(int64_t n, const std::function<void(int64_t, int64_t, int)>& f, int64_t min_chunk = 16) {
    int parts = static_cast<int>(std::min<int64_t>(threads_, std::max<int64_t>(1, n / min_chunk)));
    if (parts <= 1) {
      f(0, n, 0);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &f;
      n_ = n;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    cv_start_.notify_all();
    chunk(0);
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [this] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void chunk(int w) {
    const int64_t begin = n_ * w / parts_, end = n_ * (w + 1) / parts_;
    try {
      (*job_)(begin, end, w);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void loop(int w) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (w >= parts_) continue;
      }
      chunk(w);
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 1, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace das

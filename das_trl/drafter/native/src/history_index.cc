#include "history_index.h"

#include <chrono>

namespace das {

HistoryIndex::HistoryIndex(int depth, int gram, int num_threads) : depth_(depth), gram_(gram) {
  if (num_threads < 1) num_threads = 1;
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { worker(); });
}

HistoryIndex::~HistoryIndex() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_jobs_.notify_all();
  for (auto& t : threads_) t.join();
}

void HistoryIndex::submit(uint64_t key, SequenceSet seqs) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    jobs_.push_back(Job{key, next_ticket_++, std::move(seqs)});
    ++pending_;
  }
  cv_jobs_.notify_one();
}

void HistoryIndex::worker() {
  for (;;) {
    Job job;
    uint64_t version;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_jobs_.wait(lk, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      version = next_version_++;
    }
    auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<const Snapshot> snap;
    bool failed = false;
    try {
      if (job.seqs.size() > 0) snap = std::make_shared<const Snapshot>(job.seqs, depth_, gram_, version);
    } catch (...) {  // std::bad_alloc: keep serving the previous snapshot, count the error
      failed = true;
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lk(mu_);
      uint64_t& applied = applied_[job.key];
      if (!failed && job.ticket > applied) {  // a later job of this key may have finished first
        applied = job.ticket;
        if (snap) snaps_[job.key] = std::move(snap); else snaps_.erase(job.key);
      }
      errors_ += failed;
      ++builds_;
      build_seconds_ += dt;
      --pending_;
      if (pending_ == 0) cv_idle_.notify_all();
    }
  }
}

bool HistoryIndex::wait(double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeout_s < 0) {
    cv_idle_.wait(lk, [this] { return pending_ == 0; });
    return true;
  }
  return cv_idle_.wait_for(lk, std::chrono::duration<double>(timeout_s), [this] { return pending_ == 0; });
}

void HistoryIndex::clear() {
  wait(-1);
  std::lock_guard<std::mutex> lk(mu_);
  snaps_.clear();
  applied_.clear();
}

std::shared_ptr<const Snapshot> HistoryIndex::get(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = snaps_.find(key);
  return it == snaps_.end() ? nullptr : it->second;
}

void HistoryIndex::get_many(const uint64_t* keys, size_t n, std::vector<std::shared_ptr<const Snapshot>>& out) const {
  out.resize(n);
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < n; ++i) {
    auto it = snaps_.find(keys[i]);
    out[i] = it == snaps_.end() ? nullptr : it->second;
  }
}

HistoryIndex::Stats HistoryIndex::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s;
  for (const auto& kv : snaps_) {
    const Snapshot& x = *kv.second;
    if (kv.first == kGlobalKey) {
      s.global_tokens = x.num_tokens();
      s.global_bytes = static_cast<int64_t>(x.bytes());
      continue;
    }
    ++s.problems;
    s.tokens += x.num_tokens();
    s.sequences += x.num_sequences();
    s.states += static_cast<int64_t>(x.num_states());
    s.bytes += static_cast<int64_t>(x.bytes());
  }
  s.pending = pending_;
  s.builds = builds_;
  s.errors = errors_;
  s.build_seconds = build_seconds_;
  return s;
}

}  // namespace das

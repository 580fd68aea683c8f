// The history side of the drafter: one immutable Snapshot per problem (its windowed history) and one global
// Snapshot, built by native builder threads (no GIL) from token arrays copied at submit time, and swapped in when
// ready; until then requests keep drafting from the previous snapshots (DAS's history push never stalls the
// engine). Thread-safe: submit/drop/get may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "snapshot.h"

namespace das {

class HistoryIndex {
 public:
  static constexpr uint64_t kGlobalKey = ~0ULL;  // problem keys are < 2**63

  HistoryIndex(int depth, int gram, int num_threads);
  ~HistoryIndex();

  // Queue a rebuild of a problem's snapshot (or the global one, key kGlobalKey) from `seqs` (taken over).
  // An empty set removes the snapshot. Jobs of one key are applied in submit order.
  void submit(uint64_t key, SequenceSet seqs);
  // Blocks until every queued job is applied or timeout_s passed (< 0: no limit). True when idle.
  bool wait(double timeout_s);
  void clear();

  std::shared_ptr<const Snapshot> get(uint64_t key) const;
  // Current snapshots of many keys under one lock (out[i] may be null).
  void get_many(const uint64_t* keys, size_t n, std::vector<std::shared_ptr<const Snapshot>>& out) const;

  struct Stats {
    int64_t problems = 0, tokens = 0, sequences = 0, states = 0, bytes = 0, global_tokens = 0, global_bytes = 0;
    int64_t pending = 0, builds = 0, errors = 0;
    double build_seconds = 0.0;
  };
  Stats stats() const;

 private:
  struct Job {
    uint64_t key;
    uint64_t ticket;
    SequenceSet seqs;
  };
  void worker();

  int depth_, gram_;
  mutable std::mutex mu_;
  std::condition_variable cv_jobs_, cv_idle_;
  std::deque<Job> jobs_;
  std::unordered_map<uint64_t, std::shared_ptr<const Snapshot>> snaps_;
  std::unordered_map<uint64_t, uint64_t> applied_;  // key -> ticket of the snapshot installed
  uint64_t next_ticket_ = 1;
  uint64_t next_version_ = 1;
  int64_t pending_ = 0, builds_ = 0, errors_ = 0;
  double build_seconds_ = 0.0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace das

// An immutable suffix automaton over a fixed set of sequences (a problem's windowed history, or the global set),
// built off the interpreter on a builder thread and then only read: compact arrays (CSR edges sorted by token),
// states that cannot hold a string of length <= depth pruned, occurrence counts, each state's most frequent
// continuation (ties: smallest token), and per g-gram the number of distinct sequences containing it (the support
// of das_trl.drafter.arbitration).
#pragma once

#include <cstdint>
#include <vector>

#include "common.h"

namespace das {

struct SequenceSet {
  std::vector<int32_t> tokens;   // all sequences concatenated
  std::vector<int64_t> offsets;  // n + 1 offsets into tokens
  std::vector<int32_t> weights;  // per sequence: occurrences count this many times (>= 1)
  size_t size() const { return offsets.empty() ? 0 : offsets.size() - 1; }
};

class Snapshot {
 public:
  // Builds from `seqs`. depth: longest counted string (arctic's max_tree_depth); gram: support n-gram order g.
  Snapshot(const SequenceSet& seqs, int depth, int gram, uint64_t version);

  int32_t find(int32_t s, int32_t token) const {
    int32_t lo = edge_begin_[s], hi = edge_begin_[s + 1];
    if (hi - lo <= 8) {
      for (int32_t e = lo; e < hi; ++e)
        if (etok_[e] == token) return etgt_[e];
      return -1;
    }
    while (lo < hi) {
      int32_t mid = (lo + hi) >> 1;
      if (etok_[mid] < token) lo = mid + 1; else hi = mid;
    }
    return (lo < edge_begin_[s + 1] && etok_[lo] == token) ? etgt_[lo] : -1;
  }
  int32_t len(int32_t s) const { return len_[s]; }
  int32_t link(int32_t s) const { return link_[s]; }
  int32_t cnt(int32_t s) const { return cnt_[s]; }
  bool best(int32_t s, int32_t& token, int32_t& target) const {
    int32_t e = best_[s];
    if (e < 0) return false;
    token = etok_[e];
    target = etgt_[e];
    return true;
  }
  // Distinct sequences containing the g-gram held by state s (s must hold a string of length gram).
  int32_t distinct(int32_t s) const { return distinct_[s]; }
  int depth() const { return depth_; }
  int gram() const { return gram_; }
  uint64_t version() const { return version_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_sequences() const { return num_sequences_; }
  size_t num_states() const { return len_.size(); }
  size_t bytes() const;

 private:
  int depth_, gram_;
  uint64_t version_;
  int64_t num_tokens_ = 0, num_sequences_ = 0;
  std::vector<int32_t> len_, link_, cnt_, edge_begin_, best_, distinct_;
  std::vector<int32_t> etok_, etgt_;
};

}  // namespace das

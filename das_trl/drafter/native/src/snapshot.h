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
    int32_t lo = st_[s].edge_begin, hi = st_[s + 1].edge_begin;
    if (hi - lo <= 8) {
      for (int32_t e = lo; e < hi; ++e)
        if (edges_[e].token == token) return edges_[e].target;
      return -1;
    }
    const int32_t end = hi;
    while (lo < hi) {
      int32_t mid = (lo + hi) >> 1;
      if (edges_[mid].token < token) lo = mid + 1; else hi = mid;
    }
    return (lo < end && edges_[lo].token == token) ? edges_[lo].target : -1;
  }
  int32_t len(int32_t s) const { return st_[s].len; }
  int32_t link(int32_t s) const { return st_[s].link; }
  int32_t cnt(int32_t s) const { return st_[s].cnt; }
  bool best(int32_t s, int32_t& token, int32_t& target) const {
    const State& x = st_[s];
    if (x.best_tok < 0) return false;
    token = x.best_tok;
    target = x.best_tgt;
    return true;
  }
  // Distinct sequences containing the g-gram held by state s (s must hold a string of length gram).
  int32_t distinct(int32_t s) const { return st_[s].distinct; }
  void prefetch(int32_t s) const {
    if (s >= 0 && static_cast<size_t>(s) < st_.size()) {
      __builtin_prefetch(&st_[s]);
      __builtin_prefetch(&edges_[st_[s].edge_begin]);
    }
  }
  int depth() const { return depth_; }
  int gram() const { return gram_; }
  uint64_t version() const { return version_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_sequences() const { return num_sequences_; }
  size_t num_states() const { return st_.size() - 1; }
  size_t bytes() const { return st_.capacity() * sizeof(State) + edges_.capacity() * sizeof(Edge) + sizeof(*this); }

 private:
  // One cache line holds two states: a draft step reads len/cnt/best of one state in one access.
  struct State {
    int32_t len, link, cnt, edge_begin, best_tok, best_tgt, distinct, pad;
  };
  struct Edge {
    int32_t token, target;
  };
  int depth_, gram_;
  uint64_t version_;
  int64_t num_tokens_ = 0, num_sequences_ = 0;
  std::vector<State> st_;  // num_states + 1 (a sentinel holding the end of the last edge range)
  std::vector<Edge> edges_;
};

}  // namespace das

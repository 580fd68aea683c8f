// A generalized suffix automaton over token sequences that only grow, with the occurrence counts a suffix-tree
// drafter needs (the live sources: a request's own prompt + output, its problem's running siblings, the running
// batch).
//
// Why an automaton. arctic-inference's SuffixTree (what vLLM's `suffix` method and the Python reference use) updates
// up to `depth` active nodes per appended token and re-matches the context from the root for every match length at
// every round. A suffix automaton appends a token in amortized O(1), and each state is the set of strings that
// share their end positions: all strings of a state have the same continuation counts, so one state covers a whole
// range of match lengths. Counts are kept exactly for the states that hold a string of length <= depth ("relevant"
// states: the only ones drafting reads, since a match plus its draft never exceeds the tree depth, as in arctic).
// The per-token count update walks the suffix-link chain from the state of the sequence's depth-long suffix: at
// most `depth` states, usually a handful.
//
// Semantics (equal to arctic's tree of the same sequences, truncated at `depth`):
//   cnt(state of s) = occurrences of s in all sequences (|s| <= depth),
//   best child of s = the continuation x maximizing cnt(s + x), ties to the smallest token id.
// Not thread-safe; the owner locks.
#pragma once

#include <cstdint>
#include <vector>

#include "flat_map.h"
#include "pod_vector.h"

namespace das {

class Automaton {
 public:
  // 32 bytes: the first transition is stored inline (most states have one), further ones in the hash table.
  struct State {
    int32_t len;       // longest string of the state
    int32_t link;      // suffix link (-1 for the root)
    int32_t cnt;       // occurrences (exact for relevant states)
    int32_t best_tok;  // most frequent continuation (-1: none) and its target state
    int32_t best_tgt;
    int32_t e0_tok;    // inline first transition (-1: none)
    int32_t e0_tgt;
    int32_t more;      // head of the list of further transitions in edges_ (-1: none)
  };
  struct Edge {
    int32_t token, target, next;
  };
  // Where one sequence stands: its whole-sequence state and the state of its last min(depth, len) tokens.
  struct Cursor {
    int32_t last = 0;
    int32_t ptr = 0;
    int64_t len = 0;
  };

  // depth: the longest string whose counts are kept (arctic's max_tree_depth). online_counts=false builds the
  // structure only (the snapshot builder counts afterwards, in one pass).
  explicit Automaton(int depth, bool online_counts = true);

  void clear();
  // Pre-sizes for about n appended tokens (at most 2n states).
  void reserve(size_t n) {
    st_.reserve(2 * n + 1);
    edges_.reserve(n);
    trans_.reset(n);
  }
  // Appends one token to the sequence at `cur` with weight w (occurrences counted w times).
  void append(Cursor& cur, int32_t token, int32_t weight = 1);

  int32_t find(int32_t s, int32_t token) const {
    const State& x = st_[s];
    if (x.e0_tok == token) return x.e0_tgt;
    if (x.more < 0) return -1;
    const int32_t* e = trans_.find(key(s, token));
    return e ? edges_[*e].target : -1;
  }
  // The target field of s's transition on token (to read or redirect it), or nullptr.
  int32_t* target_ref(int32_t s, int32_t token) {
    State& x = st_[s];
    if (x.e0_tok == token) return &x.e0_tgt;
    if (x.more < 0) return nullptr;
    int32_t* e = trans_.find(key(s, token));
    return e ? &edges_[*e].target : nullptr;
  }
  int32_t len(int32_t s) const { return st_[s].len; }
  int32_t link(int32_t s) const { return st_[s].link; }
  int32_t cnt(int32_t s) const { return st_[s].cnt; }
  // Most frequent continuation of s: returns false if none, else sets token and target.
  bool best(int32_t s, int32_t& token, int32_t& target) const {
    const State& x = st_[s];
    if (x.best_tok < 0) return false;
    token = x.best_tok;
    target = x.best_tgt;
    return true;
  }
  // Calls f(token, target) for every transition of s.
  template <class F>
  void for_each_edge(int32_t s, F&& f) const {
    const State& x = st_[s];
    if (x.e0_tok >= 0) f(x.e0_tok, x.e0_tgt);
    for (int32_t e = x.more; e >= 0; e = edges_[e].next) f(edges_[e].token, edges_[e].target);
  }
  // Calls f(owner state, token, target) for every transition not stored inline, in table order (sequential memory).
  template <class F>
  void for_each_extra_edge(F&& f) const {
    trans_.for_each([&](uint64_t k, int32_t e) {
      f(static_cast<int32_t>(k >> 32), static_cast<int32_t>(k & 0xFFFFFFFFu), edges_[e].target);
    });
  }
  // The state on s's suffix-link chain holding the suffix of length n (s must hold a suffix of length >= n).
  int32_t suffix_state(int32_t s, int64_t n) const { return down_to(s, n); }
  // Hint the CPU to fetch state s (an upcoming row's first access) into cache.
  void prefetch(int32_t s) const {
    if (s >= 0 && static_cast<size_t>(s) < st_.size()) __builtin_prefetch(&st_[s]);
  }
  int depth() const { return depth_; }
  size_t num_states() const { return st_.size(); }
  const PodVector<State>& states() const { return st_; }
  size_t bytes() const;
  int64_t appends() const { return appends_; }
  int64_t chain_steps() const { return chain_steps_; }  // states visited by the count and best-continuation walks
  // Structural self-check (tests): empty string when consistent, else what is wrong.
  std::string check() const;

 private:
  static uint64_t key(int32_t s, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(s)) << 32) | static_cast<uint32_t>(token);
  }
  int32_t new_state(int32_t len, int32_t link);
  void add_edge(int32_t s, int32_t token, int32_t target);
  // Points the transitions on token that lead to q, along the suffix-link chain from p, to c.
  void redirect_chain(int32_t p, int32_t token, int32_t q, int32_t c);
  int32_t clone(int32_t q, int32_t len);
  int32_t extend(int32_t last, int32_t token);
  // The state on `s`'s suffix-link chain holding the suffix of length n (s must hold a suffix of length >= n).
  int32_t down_to(int32_t s, int64_t n) const {
    while (s != 0 && st_[st_[s].link].len >= n) s = st_[s].link;
    return s;
  }
  void offer_best(int32_t s, int32_t token, int32_t target);

  int depth_;
  bool online_counts_;
  // Not std::vector: a live automaton grows while the engine waits, and a vector's doubling copied it (pod_vector.h).
  PodVector<State> st_;
  PodVector<Edge> edges_;
  FlatMap<int32_t> trans_;
  int64_t appends_ = 0, chain_steps_ = 0;
};

}  // namespace das

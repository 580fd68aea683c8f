// Live (in-flight) sources shared between requests: per problem the running siblings' outputs, and across problems
// the running batch's outputs (DAS: "a group's siblings share a prompt"; vLLM suffix's active responses). Each group
// is an Automaton over its members' sequences (prompt tail + output) plus, per g-gram, the number of members
// containing it (support). Finished members linger, visible, until their problem's rollouts enter the history
// (release_finished) or the lingering bounds push them out; an automaton cannot forget a sequence, so a group
// that lost members is rebuilt from the rest before its next use.
//
// Lingering bound (same rule as das_trl/drafter/live.py): a finished sequence holds its prompt tail + output
// tokens; when, after a stop, the finished sequences hold more than live_token_budget tokens, the oldest (stop
// order) are dropped until they hold at most half of it, so a group is rebuilt at most once per half-budget of new
// finished tokens.
// Not thread-safe; the drafter locks.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "automaton.h"
#include "flat_map.h"
#include "pod_vector.h"

namespace das {

struct LiveConfig {
  int depth = 32;
  int gram = 3;
  int prompt_tail = 32;
  bool share_siblings = true;
  bool share_batch = true;
  int64_t live_token_budget = 2'000'000;
};

// Group key of the cross-problem batch group (problem keys are < 2**63).
constexpr uint64_t kBatchGroup = ~0ULL;

class LivePool {
 public:
  struct Gram {  // a g-gram's first occurrence in a sequence: its last token's position and its key
    int64_t pos;
    uint64_t key;
  };
  struct Seq {
    PodVector<int32_t> tokens;  // prompt tail + output (all rows grow in step: no vector copies, pod_vector.h)
    FlatMap<char> grams;          // its distinct g-gram keys
    // A group automaton may hold fewer of its tokens than `tokens` (extend's `late`): held[which] of them, and
    // fresh_held[which] of `fresh`, the first occurrences not yet counted by every group (cleared when all are).
    int64_t held[2] = {0, 0};
    size_t fresh_held[2] = {0, 0};
    PodVector<Gram> fresh;
    uint64_t problem = 0;
    bool finished = false;
    bool alive = false;
    bool lingering = false;  // finished and counted in the lingering totals
    uint32_t generation = 0;  // bumped when the id is reused (lingering queue entries carry it)
    // Cursors in its groups while running: [0] siblings, [1] batch.
    Automaton::Cursor cursor[2];
  };
  struct Group {
    explicit Group(int depth) : sam(depth) {}
    Automaton sam;
    FlatMap<int32_t> gram_counts;  // gram key -> members containing it
    std::vector<int32_t> members;  // sequence ids
    int64_t nonempty = 0;          // members holding >= 1 token (arctic's num_seqs)
    int64_t tokens = 0;
    bool dirty = false;            // lost a member: rebuild before use
  };

  explicit LivePool(const LiveConfig& cfg) : cfg_(cfg) {}

  // A running request joins its problem's sibling group and the batch group; returns its sequence id (-1 if no
  // group is on).
  int32_t start(uint64_t problem, const int32_t* prompt, int64_t prompt_len);
  // Appends tokens to a running sequence; the groups whose bit is set in `late` (1: siblings, 2: batch) get them
  // only at the next catch_up or extend of this sequence (or a rebuild of that group).
  void extend(int32_t seq, const int32_t* tokens, int64_t n, unsigned late = 0);
  // Appends to each group of the sequence what it still lacks.
  void catch_up(int32_t seq);
  // Tokens of the sequence its group `which` does not hold yet.
  int64_t lag(int32_t seq, int which) const {
    const Seq& s = *seqs_[seq];
    return static_cast<int64_t>(s.tokens.size()) - s.held[which];
  }
  // Whether the group `which` counts gram `key` among the sequence's own (in its gram_counts).
  bool counts_own_gram(int32_t seq, int which, uint64_t key) const;
  // Many sequences' new tokens appended to their groups on several threads (Drafter::step with drafting threads),
  // the automata ending exactly as serial extend(seq, tokens, n) calls in the same order leave them: for each sequence
  // in that order, extend(seq, tokens, n, kLateAll) then add_catch_up(seq) (which rebuilds a group that lost a member
  // where the serial call would); then catch_up_task(t) for every t < catch_up_tasks(), each task once, any thread
  // (a task appends one group's members in order: tasks touch disjoint automata and per-group fields), the batch
  // group's first (the largest); then end_catch_up().
  static constexpr unsigned kLateAll = 3;
  void add_catch_up(int32_t seq);
  int64_t catch_up_tasks() const { return catch_up_n_; }
  void catch_up_task(int64_t t);
  void end_catch_up();
  // The request stopped: its sequence lingers (or is dropped at once when its output is empty).
  void stop(int32_t seq, int64_t output_len);
  // Drops the finished sequences of these problems (their rollouts just entered the history).
  int64_t release_finished(const std::vector<uint64_t>& problems);
  void clear();

  // The group a running sequence is in ([0] siblings, [1] batch), rebuilt first if needed; nullptr if none.
  Group* group_of(int32_t seq, int which);
  const Seq& seq(int32_t id) const { return *seqs_[id]; }
  // The group a sequence is in, as it is (no rebuild; may be stale): for prefetching only.
  const Group* peek_group(int32_t seq, int which) const {
    if (which == 0 ? !cfg_.share_siblings : !cfg_.share_batch) return nullptr;
    auto it = groups_.find(key_of(seq, which));
    return it == groups_.end() ? nullptr : it->second.get();
  }
  Seq& seq(int32_t id) { return *seqs_[id]; }

  int64_t running_tokens() const { return running_tokens_; }
  int64_t finished_tokens() const { return finished_tokens_; }
  int64_t finished_sequences() const { return static_cast<int64_t>(lingering_count_); }
  int64_t sibling_groups() const;
  int64_t rebuilds() const { return rebuilds_; }
  int64_t evicted() const { return evicted_; }
  int64_t evicted_tokens() const { return evicted_tokens_; }
  // Tokens held by the group automata (a sequence counts once per group holding it).
  int64_t group_tokens() const {
    int64_t t = 0;
    for (const auto& kv : groups_) t += kv.second->tokens;
    return t;
  }
  // (appends, chain steps) summed over the live group automata.
  std::pair<int64_t, int64_t> walk_totals() const {
    int64_t a = 0, c = 0;
    for (const auto& kv : groups_) a += kv.second->sam.appends(), c += kv.second->sam.chain_steps();
    return {a, c};
  }
  size_t bytes() const;
  // Structural self-check of every group automaton (tests): "" when consistent.
  std::string check() const {
    for (const auto& kv : groups_) {
      if (kv.second->dirty) continue;
      std::string e = kv.second->sam.check();
      if (!e.empty()) return "group automaton: " + e;
    }
    return "";
  }

 private:
  Group& group(uint64_t key);
  void add_tokens(int32_t seq, const int32_t* tokens, int64_t n, unsigned late);
  // Appends to group `which` (g) the sequence's tokens it does not hold yet, with their first-occurrence grams.
  void append_held(Seq& s, int which, Group& g);
  bool group_on(int which) const { return which == 0 ? cfg_.share_siblings : cfg_.share_batch; }
  void drop(int32_t seq);
  void unlinger(Seq& s);
  void rebuild(uint64_t key, Group& g);
  void enforce_bounds();
  uint64_t key_of(int32_t seq, int which) const { return which == 0 ? seqs_[seq]->problem : kBatchGroup; }

  struct CatchUp {  // one group's appends in a parallel catch-up: its members' ids, in the callers' order
    Group* group = nullptr;
    int which = 0;
    std::vector<int32_t> ids;
  };

  LiveConfig cfg_;
  std::vector<CatchUp> catch_up_;  // [0, catch_up_n_) in use (the vectors are kept between steps)
  int64_t catch_up_n_ = 0;
  std::vector<int32_t> catch_up_seqs_;
  std::vector<std::unique_ptr<Seq>> seqs_;
  std::vector<int32_t> free_;
  std::unordered_map<uint64_t, std::unique_ptr<Group>> groups_;
  std::deque<std::pair<int32_t, uint32_t>> lingering_;  // (id, generation) in stop order; stale entries skipped
  size_t lingering_count_ = 0;
  int64_t running_tokens_ = 0, finished_tokens_ = 0, rebuilds_ = 0, evicted_ = 0, evicted_tokens_ = 0;
};

}  // namespace das

#include "snapshot.h"

#include <algorithm>
#include <numeric>

#include "automaton.h"

namespace das {

Snapshot::Snapshot(const SequenceSet& seqs, int depth, int gram, uint64_t version)
    : depth_(depth), gram_(gram), version_(version) {
  // 1. Structure, each position's weight on the state of its prefix, and the state holding each position's
  // gram-long suffix at insertion time (later clones only split states: walking down by length finds it again).
  Automaton a(depth, /*online_counts=*/false);
  a.reserve(seqs.tokens.size());
  std::vector<int64_t> own;
  own.reserve(2 * seqs.tokens.size() + 1);
  std::vector<int32_t> gram_state(seqs.tokens.size(), -1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    Automaton::Cursor cur;
    int32_t gptr = 0;
    const int32_t w = seqs.weights.empty() ? 1 : seqs.weights[i];
    for (int64_t p = seqs.offsets[i]; p < seqs.offsets[i + 1]; ++p) {
      const int64_t L = cur.len;
      const int32_t old = gptr;
      a.append(cur, seqs.tokens[p], w);
      if (own.size() < a.num_states()) own.resize(a.num_states(), 0);
      own[cur.last] += w;
      gptr = L + 1 <= gram ? cur.last : a.find(a.suffix_state(old, gram - 1), seqs.tokens[p]);
      if (L + 1 >= gram) gram_state[p] = gptr;
    }
    num_tokens_ += seqs.offsets[i + 1] - seqs.offsets[i];
  }
  const auto& st = a.states();
  const int32_t n = static_cast<int32_t>(st.size());
  own.resize(n, 0);
  // 2. Counts: sum over the suffix-link tree, longest states first (counting sort by len).
  int32_t max_len = 0;
  for (const auto& x : st) max_len = std::max(max_len, x.len);
  std::vector<int32_t> bucket(max_len + 2, 0), order(n);
  for (const auto& x : st) ++bucket[x.len + 1];
  for (int32_t i = 1; i <= max_len + 1; ++i) bucket[i] += bucket[i - 1];
  for (int32_t s = 0; s < n; ++s) order[bucket[st[s].len]++] = s;
  for (int32_t i = n - 1; i > 0; --i) {
    int32_t s = order[i];
    own[st[s].link] += own[s];
  }
  // 3. Keep the states holding a string of length <= depth (minlen = len(link) + 1 <= depth), renumbered so that
  // a draft's walk reads memory in order: a walk follows each state's most frequent continuation (its best edge,
  // found here: the largest count among the edges to kept states, then the smallest token), so the states are laid
  // out in chains along best edges, each state followed by its best target unless an earlier chain placed that
  // target already (several states may share one). Chains start at the shortest unplaced state (the root first: it
  // is 0 again). Only memory order changes: counts, edges and drafts are the same whatever the numbering.
  std::vector<char> keep(n);
  for (int32_t s = 0; s < n; ++s) keep[s] = s == 0 || st[st[s].link].len < depth;
  auto count = [&](int32_t s) { return static_cast<int32_t>(std::min<int64_t>(own[s], INT32_MAX)); };
  std::vector<int32_t> best_tgt(n, -1), best_tok(n, -1), best_cnt(n, -1);
  auto offer = [&](int32_t s, int32_t tok, int32_t tgt) {
    if (!keep[s] || !keep[tgt]) return;
    const int32_t c = count(tgt);
    if (c > best_cnt[s] || (c == best_cnt[s] && tok < best_tok[s])) best_cnt[s] = c, best_tok[s] = tok, best_tgt[s] = tgt;
  };
  for (int32_t s = 0; s < n; ++s)
    if (st[s].e0_tok >= 0) offer(s, st[s].e0_tok, st[s].e0_tgt);
  a.for_each_extra_edge([&](int32_t s, int32_t tok, int32_t tgt) { offer(s, tok, tgt); });
  std::vector<int32_t>().swap(best_cnt);
  std::vector<int32_t> id(n, -1);
  int32_t m = 0;
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t s = order[i]; s >= 0 && id[s] < 0 && keep[s]; s = best_tgt[s]) id[s] = m++;
  }
  st_.assign(m + 1, State{0, -1, 0, 0, -1, -1, 0, 0});
  for (int32_t s = 0; s < n; ++s) {
    if (id[s] < 0) continue;
    State& x = st_[id[s]];
    x.len = st[s].len;
    x.link = s == 0 ? -1 : id[st[s].link];
    x.cnt = count(s);
    x.best_tok = best_tok[s];
    x.best_tgt = best_tgt[s] < 0 ? -1 : id[best_tgt[s]];
  }
  std::vector<int32_t>().swap(best_tgt);
  std::vector<int32_t>().swap(best_tok);
  // 4. Edges between kept states in CSR form, sorted by token (the best one per state was set in step 3). Extra edges
  // come from the transition table in memory order, not per-state list walks.
  auto kept = [&](int32_t s) { return s >= 0 && id[s] >= 0; };
  for (int32_t s = 0; s < n; ++s)
    if (kept(s) && st[s].e0_tok >= 0 && kept(st[s].e0_tgt)) ++st_[id[s]].edge_begin;
  a.for_each_extra_edge([&](int32_t s, int32_t, int32_t tgt) {
    if (kept(s) && kept(tgt)) ++st_[id[s]].edge_begin;
  });
  int32_t total = 0;
  for (int32_t t = 0; t <= m; ++t) {
    int32_t c = st_[t].edge_begin;
    st_[t].edge_begin = total;
    total += c;
  }
  edges_.resize(total);
  std::vector<int32_t> fill(m);
  for (int32_t t = 0; t < m; ++t) fill[t] = st_[t].edge_begin;
  for (int32_t s = 0; s < n; ++s)
    if (kept(s) && st[s].e0_tok >= 0 && kept(st[s].e0_tgt))
      edges_[fill[id[s]]++] = Edge{st[s].e0_tok, id[st[s].e0_tgt]};
  a.for_each_extra_edge([&](int32_t s, int32_t tok, int32_t tgt) {
    if (kept(s) && kept(tgt)) edges_[fill[id[s]]++] = Edge{tok, id[tgt]};
  });
  for (int32_t t = 0; t < m; ++t) {
    Edge* lo = edges_.data() + st_[t].edge_begin;
    Edge* hi = edges_.data() + st_[t + 1].edge_begin;
    if (hi - lo > 1) std::sort(lo, hi, [](const Edge& x, const Edge& y) { return x.token < y.token; });
  }
  // 5. Support: per gram state, the distinct sequences with a position whose gram-long suffix it holds.
  std::vector<int32_t> last_seq(m, -1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int64_t p = seqs.offsets[i]; p < seqs.offsets[i + 1]; ++p) {
      if (gram_state[p] < 0) continue;
      const int32_t v = id[a.suffix_state(gram_state[p], gram_)];
      if (last_seq[v] != static_cast<int32_t>(i)) {
        last_seq[v] = static_cast<int32_t>(i);
        ++st_[v].distinct;
      }
    }
  }
}

}  // namespace das

#include "automaton.h"

#include <algorithm>
#include <string>

namespace das {

Automaton::Automaton(int depth, bool online_counts) : depth_(depth), online_counts_(online_counts) {
  if (depth < 1) throw InputError("Automaton: depth must be >= 1, got " + std::to_string(depth));
  clear();
}

void Automaton::clear() {
  st_.clear();
  edges_.clear();
  trans_.reset();
  new_state(0, -1);
}

size_t Automaton::bytes() const {
  return st_.bytes() + edges_.bytes() + trans_.bytes();
}

int32_t Automaton::new_state(int32_t len, int32_t link) {
  st_.push_back(State{len, link, 0, -1, -1, -1, -1, -1});
  return static_cast<int32_t>(st_.size() - 1);
}

void Automaton::add_edge(int32_t s, int32_t token, int32_t target) {
  State& x = st_[s];
  if (x.e0_tok < 0) {
    x.e0_tok = token;
    x.e0_tgt = target;
    return;
  }
  int32_t e = static_cast<int32_t>(edges_.size());
  edges_.push_back(Edge{token, target, x.more});
  st_[s].more = e;
  trans_[key(s, token)] = e;
}

void Automaton::redirect_chain(int32_t p, int32_t token, int32_t q, int32_t c) {
  for (; p >= 0; p = st_[p].link) {
    int32_t* ref = target_ref(p, token);
    if (!ref || *ref != q) return;
    *ref = c;
    if (st_[p].best_tok == token) st_[p].best_tgt = c;
  }
}

int32_t Automaton::clone(int32_t q, int32_t len) {
  int32_t c = new_state(len, st_[q].link);
  st_[c].cnt = st_[q].cnt;
  st_[c].best_tok = st_[q].best_tok;
  st_[c].best_tgt = st_[q].best_tgt;
  for_each_edge(q, [&](int32_t tok, int32_t tgt) { add_edge(c, tok, tgt); });
  st_[q].link = c;
  return c;
}

// Generalized suffix automaton extension: `last` holds the whole sequence as its longest string (true for every
// sequence at all times, since the whole sequence is the only string ending at its own end position).
int32_t Automaton::extend(int32_t last, int32_t token) {
  const int32_t* ref = target_ref(last, token);
  if (ref) {
    const int32_t q = *ref;
    if (st_[q].len == st_[last].len + 1) return q;
    int32_t c = clone(q, st_[last].len + 1);
    redirect_chain(last, token, q, c);
    return c;
  }
  int32_t cur = new_state(st_[last].len + 1, 0);
  int32_t p = last, q = -1;
  for (; p >= 0; p = st_[p].link) {
    if (const int32_t* r = target_ref(p, token)) {
      q = *r;
      break;
    }
    add_edge(p, token, cur);
  }
  if (p >= 0) {
    if (st_[p].len + 1 == st_[q].len) {
      st_[cur].link = q;
    } else {
      int32_t c = clone(q, st_[p].len + 1);
      redirect_chain(p, token, q, c);
      st_[cur].link = c;
    }
  }
  return cur;
}

void Automaton::offer_best(int32_t s, int32_t token, int32_t target) {
  State& x = st_[s];
  if (x.best_tok == token) {
    x.best_tgt = target;  // already the best; its count only grew
    return;
  }
  if (x.best_tok >= 0) {
    int32_t cb = st_[x.best_tgt].cnt, ct = st_[target].cnt;
    if (ct < cb || (ct == cb && token > x.best_tok)) return;
  }
  x.best_tok = token;
  x.best_tgt = target;
}

void Automaton::append(Cursor& cur, int32_t token, int32_t weight) {
  const int64_t L = cur.len;
  const int32_t new_last = extend(cur.last, token);
  cur.last = new_last;
  cur.len = L + 1;
  if (!online_counts_) return;
  // Old chain: the state of the old sequence's suffix of length a = min(depth - 1, L). Clones made by this extension
  // only refine links, so walking down by length from the old pointer finds it.
  const int64_t a = std::min<int64_t>(depth_ - 1, L);
  const int32_t w = down_to(cur.ptr, a);
  // New pointer: the state of the new sequence's suffix of length min(depth, L + 1).
  const int32_t np = (L + 1 <= depth_) ? new_last : find(w, token);
  cur.ptr = np;
  // Occurrence counts: every relevant state on the new chain gains this end position.
  ++appends_;
  for (int32_t s = np; s > 0; s = st_[s].link) {
    st_[s].cnt += weight;
    ++chain_steps_;
  }
  // Best continuations: exactly the states on the old chain had a continuation count change (their strings + token
  // are the new chain's strings); the target of old-chain state s is the new-chain state holding length len(s) + 1.
  int32_t u = np;
  for (int32_t s = w; s > 0; s = st_[s].link) {
    u = down_to(u, st_[s].len + 1);
    offer_best(s, token, u);
    ++chain_steps_;
  }
}

std::string Automaton::check() const {
  // Links point to shorter states, edges to longer ones, counts of relevant states are >= their children's,
  // and each best edge has the largest count among its state's edges (ties: smallest token).
  for (size_t s = 1; s < st_.size(); ++s) {
    const State& x = st_[s];
    if (x.link < 0 || x.link >= static_cast<int32_t>(st_.size())) return "bad link at " + std::to_string(s);
    if (st_[x.link].len >= x.len) return "link not shorter at " + std::to_string(s);
  }
  for (size_t s = 0; s < st_.size(); ++s) {
    const State& x = st_[s];
    bool relevant = s == 0 || st_[x.link].len < depth_ - 1;
    int32_t best_tok = -1, best_cnt = -1, best_tgt = -1;
    std::string err;
    for_each_edge(static_cast<int32_t>(s), [&](int32_t tok, int32_t tgt) {
      if (st_[tgt].len < x.len + 1) err = "edge to a shorter state at " + std::to_string(s);
      int32_t c = st_[tgt].cnt;
      if (c > best_cnt || (c == best_cnt && tok < best_tok)) best_cnt = c, best_tok = tok, best_tgt = tgt;
    });
    if (!err.empty()) return err;
    if (relevant && s != 0 && best_tok >= 0) {
      if (x.best_tok != best_tok || x.best_tgt != best_tgt)
        return "stale best continuation at state " + std::to_string(s);
    }
  }
  return "";
}

}  // namespace das

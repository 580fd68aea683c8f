// arctic-inference's SuffixTree::speculate (path mode), on a suffix automaton, for one source and one request.
//
// arctic tries every match length m = 1 .. (longest suffix of the context found in the tree, < context length),
// drafts the most frequent path after each, at most min(budget, int(m * factor + offset + 1e-6)) tokens and never
// past the tree depth (a path holds match + draft <= depth), stopping when the path's probability (float32 product
// of count ratios) falls below min_token_prob; it keeps the draft with the largest float32 sum of probabilities,
// the longer match on ties. All match lengths held by one automaton state share their continuations, so the path
// is computed once per state on the match's suffix-link chain, and the chain is left as soon as no shorter match
// can beat the best score (every probability is <= 1, so a draft of L tokens scores <= L); a state whose first
// continuation's probability p1 cannot reach the best score in the path's length (L p1) is skipped without its walk.
//
// Difference to arctic, by design: among equally frequent continuations arctic takes whichever its hash map yields
// first; here the smallest token id (deterministic, equal to das_trl.drafter.reference_tree).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace das {

constexpr int kMaxSpec = 64;  // hard cap of draft tokens per request per round

struct SpecParams {  // the drafter sets every field from its DrafterConfig; these are that config's defaults
  int depth = 64;           // tree depth D
  int max_spec_tokens = 64;  // K
  float factor = 2.0f;      // max_spec_factor
  float offset = 0.0f;      // max_spec_offset
  float min_prob = 0.1f;    // min_token_prob
  // cap_by_match[m] = max(0, int(float(m) * factor + offset + 1e-6)), as arctic computes it (float, then double).
  std::vector<int32_t> cap_by_match;
  // bound[b][m] = max over m' in [1, m] of min(b, cap_by_match[m'], D - m'): the best score any match length <= m
  // can reach with budget b.
  std::vector<std::vector<int32_t>> bound;

  void prepare() {
    cap_by_match.assign(depth + 1, 0);
    for (int m = 0; m <= depth; ++m) {
      float fm = static_cast<float>(m) * factor + offset;
      double v = static_cast<double>(fm) + 1e-6;
      cap_by_match[m] = std::max(0, static_cast<int32_t>(v));
    }
    bound.assign(max_spec_tokens + 1, std::vector<int32_t>(depth + 1, 0));
    for (int b = 0; b <= max_spec_tokens; ++b) {
      int32_t best = 0;
      for (int m = 1; m <= depth; ++m) {
        best = std::max(best, std::min({b, cap_by_match[m], depth - m}));
        bound[b][m] = best;
      }
    }
  }
  int32_t limit(int m, int budget) const { return std::min({budget, cap_by_match[m], depth - m}); }
};

struct RawDraft {
  int n = 0;           // draft tokens
  int match_len = 0;   // m of the chosen draft
  int32_t state = -1;  // state holding the matched string (for support lookups)
  float score = 0.0f;
  int32_t tokens[kMaxSpec];
  float probs[kMaxSpec];
};

// A: Automaton or Snapshot. v/ell: the state holding the longest matched suffix and its length (ell >= 1).
// own_end: occurrences of the matched strings the automaton does not hold yet (the request's own current end, in a
// shared automaton that lacks its newest tokens): each path's probabilities are counted against cnt + own_end, as
// if they were there (an end has no continuation: only the matched state's count changes).
template <class A>
void speculate(const A& a, int32_t v, int ell, int budget, const SpecParams& p, RawDraft& out, int32_t own_end = 0) {
  out.n = 0;
  out.match_len = 0;
  out.score = 0.0f;
  out.state = -1;
  if (ell <= 0 || budget <= 0) return;
  budget = std::min(budget, p.max_spec_tokens);
  int32_t tokens[kMaxSpec];
  float probs[kMaxSpec];
  float prefix[kMaxSpec + 1];
  bool have = false;
  int hi = ell;
  for (int32_t s = v; s > 0 && hi >= 1; s = a.link(s)) {
    const int lo = a.len(a.link(s)) + 1;
    if (have && static_cast<float>(p.bound[budget][hi]) <= out.score) break;
    // The longest path any m in [lo, hi] may use: limit(m) peaks somewhere in the range; take the max.
    int need = 0;
    for (int m = lo; m <= hi; ++m) need = std::max(need, p.limit(m, budget));
    if (have) {
      // Every probability on s's path is at most its first, p1 (later ones multiply it by ratios <= 1, and float
      // rounding is monotone), so no draft from s scores more than p1 summed need times: when that cannot beat the
      // best so far (a tie keeps the longer match found before), s's path is not walked. Exact: the same draft.
      int32_t t1 = 0, n1 = 0;
      if (!a.best(s, t1, n1)) {
        hi = lo - 1;
        continue;
      }
      const float p1 = 1.0f * (static_cast<float>(a.cnt(n1)) / static_cast<float>(a.cnt(s) + own_end));
      // need x p1, raised past the float sum of need copies of p1 (relative rounding error < need x 2^-24)
      const float most = p1 * static_cast<float>(need) * 1.00001f;
      if (most <= out.score) {
        hi = lo - 1;
        continue;
      }
    }
    int k = 0;
    float prob = 1.0f;
    int32_t node = s;
    while (k < need) {
      int32_t tok = 0, nxt = 0;
      if (!a.best(node, tok, nxt)) break;
      const int32_t den = k == 0 ? a.cnt(node) + own_end : a.cnt(node);
      float np = prob * (static_cast<float>(a.cnt(nxt)) / static_cast<float>(den));
      if (!(np >= p.min_prob)) break;
      tokens[k] = tok;
      probs[k] = np;
      prob = np;
      node = nxt;
      ++k;
    }
    prefix[0] = 0.0f;
    for (int j = 0; j < k; ++j) prefix[j + 1] = prefix[j] + probs[j];
    for (int m = hi; m >= lo; --m) {
      int L = std::min(p.limit(m, budget), k);
      float sc = prefix[L];
      if (!have || sc > out.score) {
        have = true;
        out.score = sc;
        out.match_len = m;
        out.n = L;
        out.state = s;
        std::copy(tokens, tokens + L, out.tokens);
        std::copy(probs, probs + L, out.probs);
      }
    }
    hi = lo - 1;
  }
  if (out.n == 0) out.match_len = 0;
}

}  // namespace das

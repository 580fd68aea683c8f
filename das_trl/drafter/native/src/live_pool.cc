#include "live_pool.h"

#include <algorithm>

namespace das {

LivePool::Group& LivePool::group(uint64_t key) {
  auto it = groups_.find(key);
  if (it == groups_.end()) it = groups_.emplace(key, std::make_unique<Group>(cfg_.depth)).first;
  return *it->second;
}

int32_t LivePool::start(uint64_t problem, const int32_t* prompt, int64_t prompt_len) {
  if (!cfg_.share_siblings && !cfg_.share_batch) return -1;
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<int32_t>(seqs_.size());
    seqs_.push_back(std::make_unique<Seq>());
  }
  Seq& s = *seqs_[id];
  s.tokens.clear();
  s.grams.reset();
  s.problem = problem;
  s.finished = false;
  s.alive = true;
  s.lingering = false;
  ++s.generation;
  s.cursor[0] = s.cursor[1] = Automaton::Cursor();
  for (int which = 0; which < 2; ++which) {
    if (which == 0 ? !cfg_.share_siblings : !cfg_.share_batch) continue;
    Group& g = group(key_of(id, which));
    g.members.push_back(id);
  }
  s.held[0] = s.held[1] = 0;
  s.fresh.clear();
  s.fresh_held[0] = s.fresh_held[1] = 0;
  const int64_t tail = std::min<int64_t>(cfg_.prompt_tail, prompt_len);
  add_tokens(id, prompt + (prompt_len - tail), tail, 0);
  return id;
}

void LivePool::extend(int32_t id, const int32_t* tokens, int64_t n, unsigned late) { add_tokens(id, tokens, n, late); }

void LivePool::catch_up(int32_t id) { add_tokens(id, nullptr, 0, 0); }

void LivePool::add_tokens(int32_t id, const int32_t* tokens, int64_t n, unsigned late) {
  Seq& s = *seqs_[id];
  const int gm = cfg_.gram;
  for (int64_t i = 0; i < n; ++i) {
    s.tokens.push_back(tokens[i]);
    const int64_t p = static_cast<int64_t>(s.tokens.size()) - 1;
    if (p + 1 < gm) continue;
    const uint64_t k = gram_key(s.tokens.data() + p + 1 - gm, gm);
    if (s.grams.find(k)) continue;
    s.grams[k] = 1;
    s.fresh.push_back(Gram{p, k});
  }
  running_tokens_ += n;
  bool all = true;  // every group holds every token
  for (int which = 0; which < 2; ++which) {
    if (!group_on(which)) continue;
    if (late & (1u << which)) {
      all &= s.held[which] == static_cast<int64_t>(s.tokens.size());
      continue;
    }
    Group* g = group_of(id, which);  // a rebuild appends every token already
    if (g) append_held(s, which, *g);
  }
  if (all) {
    s.fresh.clear();
    s.fresh_held[0] = s.fresh_held[1] = 0;
  }
}

void LivePool::append_held(Seq& s, int which, Group& g) {
  const int64_t end = static_cast<int64_t>(s.tokens.size());
  const int64_t from = s.held[which];
  if (from == end) return;
  if (from == 0) g.nonempty += 1;
  g.tokens += end - from;
  for (int64_t p = from; p < end; ++p) g.sam.append(s.cursor[which], s.tokens[p]);
  for (size_t f = s.fresh_held[which]; f < s.fresh.size(); ++f) g.gram_counts[s.fresh[f].key] += 1;
  s.held[which] = end;
  s.fresh_held[which] = s.fresh.size();
}

void LivePool::add_catch_up(int32_t id) {
  catch_up_seqs_.push_back(id);
  for (int which = 0; which < 2; ++which) {
    Group* g = group_on(which) ? group_of(id, which) : nullptr;  // the serial extend's rebuild point
    if (!g) continue;
    int64_t t = 0;
    while (t < catch_up_n_ && catch_up_[t].group != g) ++t;  // a step's groups: a few dozen at most
    if (t == catch_up_n_) {
      if (static_cast<int64_t>(catch_up_.size()) == t) catch_up_.emplace_back();
      catch_up_[t].group = g;
      catch_up_[t].which = which;
      catch_up_[t].ids.clear();
      ++catch_up_n_;
      if (which == 1 && t > 0) std::swap(catch_up_[0], catch_up_[t]);  // the batch group first
    }
    catch_up_[which == 1 ? 0 : t].ids.push_back(id);
  }
}

void LivePool::catch_up_task(int64_t t) {
  CatchUp& c = catch_up_[t];
  for (int32_t id : c.ids) append_held(*seqs_[id], c.which, *c.group);
}

void LivePool::end_catch_up() {
  for (int32_t id : catch_up_seqs_) {  // as add_tokens leaves a sequence that no group held back
    Seq& s = *seqs_[id];
    s.fresh.clear();
    s.fresh_held[0] = s.fresh_held[1] = 0;
  }
  catch_up_seqs_.clear();
  catch_up_n_ = 0;
}

bool LivePool::counts_own_gram(int32_t id, int which, uint64_t key) const {
  const Seq& s = *seqs_[id];
  if (!s.grams.find(key)) return false;
  for (size_t f = s.fresh_held[which]; f < s.fresh.size(); ++f)
    if (s.fresh[f].key == key) return false;  // a first occurrence the group does not hold yet
  return true;
}

LivePool::Group* LivePool::group_of(int32_t id, int which) {
  if (which == 0 ? !cfg_.share_siblings : !cfg_.share_batch) return nullptr;
  const uint64_t key = key_of(id, which);
  auto it = groups_.find(key);
  if (it == groups_.end()) return nullptr;
  Group& g = *it->second;
  if (g.dirty) rebuild(key, g);
  return &g;
}

void LivePool::rebuild(uint64_t key, Group& g) {
  const int which = key == kBatchGroup ? 1 : 0;
  g.sam.clear();
  g.gram_counts.reset();
  g.nonempty = 0;
  g.tokens = 0;
  for (int32_t id : g.members) {
    Seq& s = *seqs_[id];
    Automaton::Cursor cur;
    for (int32_t t : s.tokens) g.sam.append(cur, t);
    s.cursor[which] = cur;  // kept for running members; harmless for finished ones
    s.held[which] = static_cast<int64_t>(s.tokens.size());
    s.fresh_held[which] = s.fresh.size();
    s.grams.for_each([&](uint64_t k, char) { g.gram_counts[k] += 1; });
    g.nonempty += !s.tokens.empty();
    g.tokens += static_cast<int64_t>(s.tokens.size());
  }
  g.dirty = false;
  ++rebuilds_;
}

void LivePool::stop(int32_t id, int64_t output_len) {
  Seq& s = *seqs_[id];
  running_tokens_ -= static_cast<int64_t>(s.tokens.size());
  s.finished = true;
  if (output_len == 0) {
    drop(id);
    return;
  }
  finished_tokens_ += static_cast<int64_t>(s.tokens.size());
  s.lingering = true;
  lingering_.emplace_back(id, s.generation);
  ++lingering_count_;
  enforce_bounds();
}

void LivePool::enforce_bounds() {
  const int64_t budget = cfg_.live_token_budget;
  if (finished_tokens_ <= budget) return;
  while (!lingering_.empty() && finished_tokens_ > budget / 2) {
    auto [id, gen] = lingering_.front();
    lingering_.pop_front();
    Seq& s = *seqs_[id];
    if (!s.alive || !s.lingering || s.generation != gen) continue;  // released already, or the id was reused
    evicted_tokens_ += static_cast<int64_t>(s.tokens.size());
    drop(id);
    ++evicted_;
  }
}

void LivePool::drop(int32_t id) {
  Seq& s = *seqs_[id];
  if (!s.alive) return;
  unlinger(s);
  for (int which = 0; which < 2; ++which) {
    if (which == 0 ? !cfg_.share_siblings : !cfg_.share_batch) continue;
    const uint64_t key = key_of(id, which);
    auto it = groups_.find(key);
    if (it == groups_.end()) continue;
    Group& g = *it->second;
    g.members.erase(std::find(g.members.begin(), g.members.end(), id));
    if (g.members.empty()) {
      groups_.erase(it);
    } else {
      g.dirty = true;
    }
  }
  s.alive = false;
  free_.push_back(id);
}

void LivePool::unlinger(Seq& s) {
  if (!s.lingering) return;
  s.lingering = false;
  finished_tokens_ -= static_cast<int64_t>(s.tokens.size());
  --lingering_count_;
}

int64_t LivePool::release_finished(const std::vector<uint64_t>& problems) {
  int64_t dropped = 0;
  for (uint64_t p : problems) {
    auto it = groups_.find(cfg_.share_siblings ? p : kBatchGroup);
    if (it == groups_.end()) continue;
    std::vector<int32_t> victims;
    for (int32_t id : it->second->members)
      if (seqs_[id]->finished && seqs_[id]->problem == p) victims.push_back(id);
    for (int32_t id : victims) {
      drop(id);
      ++dropped;
    }
  }
  if (lingering_.size() > 2 * lingering_count_ + 1024) {  // released entries are stale: keep the queue O(live)
    std::deque<std::pair<int32_t, uint32_t>> keep;
    for (const auto& e : lingering_) {
      const Seq& s = *seqs_[e.first];
      if (s.alive && s.lingering && s.generation == e.second) keep.push_back(e);
    }
    lingering_.swap(keep);
  }
  return dropped;
}

void LivePool::clear() {
  seqs_.clear();
  free_.clear();
  groups_.clear();
  lingering_.clear();
  lingering_count_ = 0;
  running_tokens_ = finished_tokens_ = evicted_ = evicted_tokens_ = 0;
}

int64_t LivePool::sibling_groups() const {
  int64_t n = 0;
  for (const auto& kv : groups_) n += kv.first != kBatchGroup;
  return n;
}

size_t LivePool::bytes() const {
  size_t b = 0;
  for (const auto& kv : groups_) {
    const Group& g = *kv.second;
    b += g.sam.bytes() + g.gram_counts.bytes() + g.members.capacity() * sizeof(int32_t) + sizeof(Group);
  }
  for (const auto& s : seqs_)
    if (s) b += s->tokens.bytes() + s->grams.bytes() + sizeof(Seq);
  return b;
}

}  // namespace das

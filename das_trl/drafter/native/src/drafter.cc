#include "drafter.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <tuple>

namespace das {

namespace {

LiveConfig live_config(const DrafterConfig& c) {
  LiveConfig l;
  l.depth = c.depth;
  l.gram = c.gram;
  l.prompt_tail = c.prompt_tail;
  l.share_siblings = c.share_siblings;
  l.share_batch = c.share_batch;
  l.live_token_budget = c.live_token_budget;
  return l;
}

template <class A>
int32_t down_to(const A& a, int32_t s, int64_t n) {
  while (s != 0 && a.len(a.link(s)) >= n) s = a.link(s);
  return s;
}

// Capped matching step: (v, ell) is the longest suffix (<= previous cap) present; returns the longest suffix
// <= cap after appending c. ell <= depth - 1 before the step keeps v on states whose edges are all present.
template <class A>
void advance(const A& a, int32_t& v, int32_t& ell, int32_t c, int32_t cap) {
  // Text mostly follows the most frequent continuation: its target is in the state already read (no edge search).
  int32_t bt = 0, nx = 0;
  if (!(a.best(v, bt, nx) && bt == c)) nx = a.find(v, c);
  while (nx < 0 && v != 0) {
    v = a.link(v);
    ell = a.len(v);
    nx = a.find(v, c);
  }
  if (nx < 0) {
    v = 0;
    ell = 0;
  } else {
    v = nx;
    ++ell;
  }
  if (ell > cap) {
    ell = std::max(cap, 0);
    v = down_to(a, v, ell);
  }
}

// Fresh capped match of the last ctx_len tokens of a text of text_len tokens.
template <class A>
void match_tail(const A& a, const int32_t* ctx, int ctx_len, int64_t text_len, int match_context, int32_t& v,
                int32_t& ell) {
  v = 0;
  ell = 0;
  for (int i = 0; i < ctx_len; ++i) {
    const int64_t L = text_len - ctx_len + i + 1;
    advance(a, v, ell, ctx[i], static_cast<int32_t>(std::min<int64_t>(match_context - 1, L - 1)));
  }
}

// CPU time of the calling thread (seconds): the ingest thread's own work, apart from the time it waited for a core.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Row i of a batch's outputs reads as "no draft": its tokens / accept row zeroed as `fill` says (Drafter::Fill).
inline void no_draft(int64_t i, int K, int32_t* tokens, double* accept, int32_t* lengths, int8_t* source,
                     int32_t* match_len, int fill) {
  if (fill == Drafter::kFillAll) {
    std::fill(tokens + i * K, tokens + (i + 1) * K, 0);
    std::fill(accept + i * K, accept + (i + 1) * K, 0.0);
  } else if (fill == Drafter::kFillPrevious && lengths[i] != 0) {
    const int64_t was = std::min<int64_t>(std::max<int32_t>(lengths[i], 0), K);
    std::fill(tokens + i * K, tokens + i * K + was, 0);
    std::fill(accept + i * K, accept + i * K + was, 0.0);
  }
  lengths[i] = 0;
  source[i] = -1;
  match_len[i] = 0;
}

}  // namespace

void DrafterConfig::validate() const {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw InputError("native DrafterConfig: " + msg);
  };
  need(depth >= 2 && depth <= 4096, "max_tree_depth must be in [2, 4096], got " + std::to_string(depth));
  need(match_context >= 1 && match_context <= depth,
       "match_context_tokens must be in [1, max_tree_depth], got " + std::to_string(match_context));
  need(max_spec_tokens >= 1 && max_spec_tokens <= kMaxSpec,
       "max_spec_tokens must be in [1, " + std::to_string(kMaxSpec) + "], got " + std::to_string(max_spec_tokens));
  need(gram >= 2 && gram <= depth, "support_ngram must be in [2, max_tree_depth], got " + std::to_string(gram));
  need(cal_bins >= 1 && cal_pseudocount > 0 && cal_cap > cal_pseudocount, "bad calibration settings");
  need(builder_threads >= 1 && builder_threads <= 64, "builder_threads must be in [1, 64]");
  need(draft_threads >= 1 && draft_threads <= 64, "draft_threads must be in [1, 64]");
  need(late_groups >= 0 && late_groups <= 3, "late_shared_groups must be in [0, 3], got " + std::to_string(late_groups));
}

Drafter::Drafter(const DrafterConfig& cfg)
    : cfg_((cfg.validate(), cfg)),
      pool_(live_config(cfg)),
      history_(cfg.depth, cfg.gram, cfg.builder_threads),
      cal_(cfg.cal_bins, cfg.cal_pseudocount, cfg.cal_cap, cfg.cal_decay) {
  sp_.depth = cfg.depth;
  sp_.max_spec_tokens = cfg.max_spec_tokens;
  sp_.factor = static_cast<float>(cfg.max_spec_factor);
  sp_.offset = static_cast<float>(cfg.max_spec_offset);
  sp_.min_prob = static_cast<float>(cfg.min_token_prob);
  sp_.prepare();
  late_groups_ = cfg.defer_shared_ingest ? static_cast<unsigned>(cfg.late_groups) : 0u;
  if (cfg.draft_threads > 1) workers_ = std::make_unique<WorkerPool>(cfg.draft_threads);
  if (cfg.background_ingest) ingest_thread_ = std::thread([this] { ingest_loop(); });
}

Drafter::~Drafter() {
  if (!ingest_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);  // waits for an ingest in progress
    ingest_stop_ = true;
    ingest_events_.fetch_add(1, std::memory_order_release);  // a polling thread looks
  }
  ingest_cv_.notify_all();
  ingest_thread_.join();
}

// ------------------------------------------------------------------ deferred ingest

void Drafter::ingest_loop() {
  Lock lk(mu_);
  auto last_work = std::chrono::steady_clock::now();  // its last ingest, or the last event it saw
  uint64_t seen = ingest_events_.load(std::memory_order_relaxed);
  for (;;) {
    if (ingest_stop_) return;
    if (ingest_hold_ || !ingest_ready_ || defer_rows_.empty()) {  // nothing to take: poll, or park after a pause
      auto now = std::chrono::steady_clock::now();
      if (ingest_events_.load(std::memory_order_relaxed) != seen) {  // steps keep offering tokens (a caller may
        seen = ingest_events_.load(std::memory_order_relaxed);         // have ingested them first)
        last_work = now;
      }
      if (now - last_work < kIngestPollWindow) {
        // Polls without the lock (a caller in the middle of a step never finds it taken, nor has to wake the
        // thread when it lets go of it); takes it again only when something happened or the window ends.
        lk.unlock();
        do {
          std::this_thread::sleep_for(kIngestPollInterval);
          now = std::chrono::steady_clock::now();
        } while (ingest_events_.load(std::memory_order_acquire) == seen && now - last_work < kIngestPollWindow);
        lk.lock();
      } else {
        ingest_parked_ = true;
        ingest_cv_.wait(lk);
        ingest_parked_ = false;
      }
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    ingesting_.store(true, std::memory_order_relaxed);
    try {
      ingest_deferred_locked(true);
    } catch (...) {  // std::bad_alloc: the next caller that needs the state raises it
      ingest_error_ = std::current_exception();
      defer_rows_.clear();
      defer_tokens_.clear();
    }
    ingesting_.store(false, std::memory_order_relaxed);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ingest_.background_seconds += dt;
    ingest_.last_seconds = dt;
    ingest_.background_cpu_seconds += thread_cpu_seconds() - c0;
    last_work = std::chrono::steady_clock::now();
  }
}

void Drafter::ingest_deferred_locked(bool background) {
  const size_t m = defer_rows_.size();
  behind_.clear();
  for (size_t j = 0; j < m; ++j) {
    if (background && ingest_delay_us_ > 0)  // tests: a slow ingest, so that callers arrive while it runs
      std::this_thread::sleep_for(std::chrono::microseconds(ingest_delay_us_));
    if (j + 2 < m) prefetch_row(reqs_[defer_rows_[j + 2].slot], nullptr, nullptr);
    const Deferred& d = defer_rows_[j];
    Request& r = reqs_[d.slot];
    const int32_t* t = defer_tokens_.data() + d.begin;
    if (d.what == Deferred::kStart) {
      build_locked(r, t, d.n);
    } else if (d.what == Deferred::kAll) {
      extend_locked(r, t, d.n);
      if (background && (r.hm[0].version || r.hm[1].version)) behind_.push_back(d.slot);
    } else if (r.seq >= 0) {
      pool_.catch_up(r.seq);
    }
  }
  defer_rows_.clear();
  defer_tokens_.clear();
  ingest_ready_ = false;
  if (defer_tokens_.capacity() > (size_t{1} << 22)) std::vector<int32_t>().swap(defer_tokens_);  // after a huge step
  if (!behind_.empty()) catch_up_history_locked();
}

// The ingest thread's part of the history matches: rows that drafted before (their match states are kept) follow
// the tokens just ingested here, so their next draft advances over that step's tokens only. The result is the same
// whenever it is done (sync_history), so drafts do not depend on it; a caller's ingest leaves it to the draft.
void Drafter::catch_up_history_locked() {
  std::sort(behind_.begin(), behind_.end());
  behind_.erase(std::unique(behind_.begin(), behind_.end()), behind_.end());
  keys_bg_.resize(behind_.size() + 1);
  for (size_t j = 0; j < behind_.size(); ++j) keys_bg_[j] = reqs_[behind_[j]].problem;
  keys_bg_.back() = HistoryIndex::kGlobalKey;
  history_.get_many(keys_bg_.data(), keys_bg_.size(), snaps_bg_);
  const Snapshot* gsnap = cfg_.use_global ? snaps_bg_.back().get() : nullptr;
  for (size_t j = 0; j < behind_.size(); ++j) {
    Request& r = reqs_[behind_[j]];
    if (!hot_[behind_[j]].active) continue;
    const Snapshot* psnap = cfg_.use_problem ? snaps_bg_[j].get() : nullptr;
    if (psnap && r.hm[0].version) sync_history(r, *psnap, r.hm[0]);
    if (gsnap && r.hm[1].version) sync_history(r, *gsnap, r.hm[1]);
  }
  behind_.clear();
  snaps_bg_.clear();
}

void Drafter::release_ingest() {
  Lock lk(mu_);
  if (defer_rows_.empty()) return;
  offer_ingest_locked(lk);
}

void Drafter::offer_ingest_locked(Lock& lk) {
  ingest_ready_ = true;
  ingest_events_.fetch_add(1, std::memory_order_release);
  if (!ingest_parked_) return;  // polling (or at work): it finds the tokens without a wake-up
  ++ingest_.wakeups;
  lk.unlock();
  ingest_cv_.notify_one();
}

void Drafter::sync_locked() {
  if (!start_rows_.empty()) queue_starts_locked(false);
  ingest_queue_locked();
}

void Drafter::queue_starts_locked(bool build_drafting) {
  // The list is taken out before anything can throw (std::bad_alloc): like the thread's ingest, an error drops what
  // was not done rather than leaving entries to be built twice or read from a moved buffer.
  starting_.clear();
  starting_.swap(start_rows_);
  // Usually the queue is empty (the thread took the earlier steps' work during the forward pass): the prompts then
  // become the queue's tokens where they are, without a second copy.
  const bool in_place = defer_rows_.empty();
  if (in_place) defer_tokens_.swap(start_tokens_);
  const int32_t* prompts = (in_place ? defer_tokens_ : start_tokens_).data();
  for (const Deferred& d : starting_) {
    if (build_drafting && hot_[d.slot].drafts_in == list_epoch_) build_locked(reqs_[d.slot], prompts + d.begin, d.n);
    else if (in_place) defer_rows_.push_back(d);
    else defer_row(d.slot, prompts + d.begin, d.n, Deferred::kStart);
  }
  if (in_place && defer_rows_.empty()) defer_tokens_.clear();  // every one was built: nothing is queued
  starting_.clear();
  start_tokens_.clear();
  if (start_tokens_.capacity() > (size_t{1} << 22)) std::vector<int32_t>().swap(start_tokens_);  // a huge batch
}

void Drafter::ingest_queue_locked() {
  if (!defer_rows_.empty()) {  // the thread has not started it: the caller needs the state now
    ++ingest_.caller_ingests;
    ingest_deferred_locked();
  }
  if (ingest_error_) {
    std::exception_ptr e = ingest_error_;
    ingest_error_ = nullptr;
    std::rethrow_exception(e);
  }
}

Drafter::Lock Drafter::lock_synced() const {
  Drafter* self = const_cast<Drafter*>(this);
  Lock lk(self->mu_);  // the ingest thread holds mu_ for a whole step's ingest: this waits for one in progress
  self->sync_locked();
  return lk;
}

void Drafter::flush() { lock_synced(); }

void Drafter::set_ingest_delay(int64_t us) {
  std::lock_guard<std::mutex> lk(mu_);
  ingest_delay_us_ = std::max<int64_t>(us, 0);
}

void Drafter::hold_ingest(bool hold) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ingest_hold_ = hold;
    ingest_events_.fetch_add(1, std::memory_order_release);
  }
  ingest_cv_.notify_all();
}

Drafter::IngestStats Drafter::ingest_stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  IngestStats s = ingest_;
  // The entries' own counts: a prompt built at once may stay in defer_tokens_, unreferenced (queue_starts_locked).
  s.queued_tokens = static_cast<int64_t>(start_tokens_.size());
  for (const Deferred& d : defer_rows_) s.queued_tokens += d.n;
  clockid_t clock;
  timespec ts{};
  if (ingest_thread_.joinable() &&
      pthread_getcpuclockid(const_cast<std::thread&>(ingest_thread_).native_handle(), &clock) == 0 &&
      clock_gettime(clock, &ts) == 0)
    s.thread_cpu_seconds = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  return s;
}

Drafter::Request& Drafter::req(int32_t slot) {
  if (slot < 0 || slot >= static_cast<int32_t>(reqs_.size()) || !hot_[slot].active)
    throw std::out_of_range("request slot " + std::to_string(slot) + " is not active (call start first)");
  return reqs_[slot];
}
const Drafter::Request& Drafter::req(int32_t slot) const { return const_cast<Drafter*>(this)->req(slot); }

void Drafter::start(int32_t slot, const int32_t* prompt, int64_t n, uint64_t problem) {
  if (!ingest_thread_.joinable()) {
    Lock lk = lock_synced();
    start_locked(slot, prompt, n, problem);
    return;
  }
  // The request is active at once; its prompt reaches its automata on the ingest thread, queued with the steps'
  // tokens (in order: every reader completes the queue first), so a start costs the engine a copy of the prompt. It
  // waits in start_rows_ until the next step, which builds it at once if it drafts there (queue_starts_locked).
  Lock lk(mu_);
  if (ingest_error_) sync_locked();  // rethrows
  register_locked(slot, n, problem);
  start_rows_.push_back(Deferred{slot, Deferred::kStart, static_cast<int64_t>(start_tokens_.size()), n});
  start_tokens_.insert(start_tokens_.end(), prompt, prompt + n);
}

void Drafter::start_locked(int32_t slot, const int32_t* prompt, int64_t n, uint64_t problem) {
  register_locked(slot, n, problem);
  build_locked(reqs_[slot], prompt, n);
}

void Drafter::register_locked(int32_t slot, int64_t n, uint64_t problem) {
  if (slot < 0 || slot > (1 << 24)) throw InputError("slot must be in [0, 2**24], got " + std::to_string(slot));
  if (slot >= static_cast<int32_t>(reqs_.size())) reqs_.resize(slot + 1), hot_.resize(slot + 1);
  Request& r = reqs_[slot];
  Hot& h = hot_[slot];
  if (h.active) throw InputError("request slot " + std::to_string(slot) + " is already active");
  h.active = true;
  h.seen = 0;
  h.prompt_len = n;
  h.pend_n = -1;
  r.problem = problem;
  r.seq = -1;
  ++active_;
  ++ctr_.requests;
}

void Drafter::build_locked(Request& r, const int32_t* prompt, int64_t n) {
  r.text_len = n;
  r.output_len = 0;
  r.ctx.assign(prompt + (n - std::min<int64_t>(n, cfg_.match_context)), prompt + n);
  r.hm[0] = r.hm[1] = HistMatch();
  r.local_cur = Automaton::Cursor();
  if (cfg_.use_local) {
    if (!r.local) r.local = std::make_unique<Automaton>(cfg_.depth); else r.local->clear();
    for (int64_t i = 0; i < n; ++i) r.local->append(r.local_cur, prompt[i]);
  } else {
    r.local.reset();
  }
  r.seq = pool_.start(r.problem, prompt, n);
}

void Drafter::extend(int32_t slot, const int32_t* tokens, int64_t n) {
  Lock lk = lock_synced();
  Request& r = req(slot);
  if (n > 0) hot(r).seen += n;
  extend_locked(r, tokens, n);
}

// Appends to the request's automata, gram sets and match state; Hot (the caller's) is not touched: the ingest thread
// runs this too.
void Drafter::extend_locked(Request& r, const int32_t* tokens, int64_t n) {
  extend_own_locked(r, tokens, n);
  extend_shared_locked(r, tokens, n);
}

// What only the request's own drafts read: its own automaton, its recent tokens and lengths, its history matches.
void Drafter::extend_own_locked(Request& r, const int32_t* tokens, int64_t n) {
  if (n <= 0) return;
  if (r.local)
    for (int64_t i = 0; i < n; ++i) r.local->append(r.local_cur, tokens[i]);
  r.ctx.insert(r.ctx.end(), tokens, tokens + n);
  if (static_cast<int64_t>(r.ctx.size()) > 2 * cfg_.match_context)
    r.ctx.erase(r.ctx.begin(), r.ctx.end() - cfg_.match_context);
  r.text_len += n;
  r.output_len += n;
  r.hm[0].pending += n;
  r.hm[1].pending += n;
}

// What other requests' drafts read too: the sibling and batch automata and their gram counts.
void Drafter::extend_shared_locked(Request& r, const int32_t* tokens, int64_t n) {
  if (n > 0 && r.seq >= 0) pool_.extend(r.seq, tokens, n);
}

// Drafting rows with new tokens from which a step appends them on the drafting threads: waking the threads costs a
// few microseconds, a row's appends ~7 us on AMC23 (a threshold chosen, not swept; benchmarks/NOTES.md, "The drafting
// rows' appends on the drafting threads").
constexpr size_t kMinParallelExtends = 4;

void Drafter::queue_extend(int32_t slot, const int32_t* tokens, int64_t n) {
  Request& r = reqs_[slot];
  if (r.seq >= 0) {  // the tokens join the live sequence now; its groups get them in run_queued_extends
    pool_.extend(r.seq, tokens, n, LivePool::kLateAll);
    pool_.add_catch_up(r.seq);
  }
  extend_queue_.push_back(QueuedExtend{slot, tokens, n});
}

void Drafter::run_queued_extends() {
  const int64_t groups = pool_.catch_up_tasks();
  const int64_t tasks = groups + static_cast<int64_t>(extend_queue_.size());
  std::atomic<int64_t> next{0};
  auto work = [&](int64_t, int64_t, int) {  // each thread takes the next task: the batch group's first
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
      if (t < groups) {
        pool_.catch_up_task(t);
      } else {
        const QueuedExtend& q = extend_queue_[t - groups];
        extend_own_locked(reqs_[q.slot], q.tokens, q.n);
      }
    }
  };
  try {
    workers_->run(workers_->threads(), work, 1);
  } catch (...) {
    pool_.end_catch_up();
    extend_queue_.clear();
    throw;
  }
  pool_.end_catch_up();
  extend_queue_.clear();
}

void Drafter::defer_row(int32_t slot, const int32_t* tokens, int64_t n, uint8_t what) {
  defer_rows_.push_back(Deferred{slot, what, static_cast<int64_t>(defer_tokens_.size()), n});
  if (n == 1) defer_tokens_.push_back(*tokens); else defer_tokens_.insert(defer_tokens_.end(), tokens, tokens + n);
}

void Drafter::stop(int32_t slot) {
  Lock lk = lock_synced();  // a stopping request's text must be complete for its siblings
  stop_locked(req(slot));
}

void Drafter::stop_locked(Request& r) {
  if (r.seq >= 0) pool_.stop(r.seq, r.output_len);
  r.seq = -1;
  Hot& h = hot(r);
  h.active = false;
  h.pend_n = -1;
  if (r.local && r.local->num_states() > 4096) r.local.reset();  // do not keep a long request's memory around
  --active_;
}

bool Drafter::active(int32_t slot) const {
  std::lock_guard<std::mutex> lk(mu_);
  return slot >= 0 && slot < static_cast<int32_t>(reqs_.size()) && hot_[slot].active;
}

uint64_t Drafter::problem_of(int32_t slot) const {
  std::lock_guard<std::mutex> lk(mu_);
  return req(slot).problem;
}

void Drafter::sync_history(Request& r, const Snapshot& s, HistMatch& hm) const {
  const int ctx_len = static_cast<int>(std::min<int64_t>(cfg_.match_context, r.text_len));
  const int32_t* ctx = r.ctx.data() + r.ctx.size() - ctx_len;
  if (hm.version != s.version() || hm.pending > ctx_len) {
    match_tail(s, ctx, ctx_len, r.text_len, cfg_.match_context, hm.v, hm.ell);
  } else {
    for (int64_t i = hm.pending; i > 0; --i) {
      const int64_t L = r.text_len - i + 1;
      advance(s, hm.v, hm.ell, ctx[ctx_len - i],
              static_cast<int32_t>(std::min<int64_t>(cfg_.match_context - 1, L - 1)));
    }
  }
  hm.version = s.version();
  hm.pending = 0;
}

int64_t Drafter::snapshot_support(const Snapshot& s, const RawDraft& d, const int32_t* ctx, int ctx_len) const {
  const int g = cfg_.gram;
  if (ctx_len < g - 1) return 0;
  int32_t u = 0;
  if (d.match_len >= g - 1) {
    int32_t tok = 0, t1 = 0;
    s.best(d.state, tok, t1);
    u = down_to(s, t1, g);
  } else {
    u = 0;
    for (int i = ctx_len - (g - 1); i < ctx_len && u >= 0; ++i) u = s.find(u, ctx[i]);
    if (u >= 0) u = s.find(u, d.tokens[0]);
    if (u < 0) return 0;
  }
  return s.distinct(u);
}

void Drafter::propose_row(Request& r, int budget, const Snapshot* psnap, const Snapshot* gsnap, RowOut& out,
                          Counters& ctr) {
  out.length = 0;
  out.source = -1;
  out.match_len = 0;
  Hot& h = hot(r);
  h.pend_n = -1;  // a draft never reported verified teaches nothing
  const int k = std::min(budget, cfg_.max_spec_tokens);
  if (k <= 0) return;
  ++ctr.proposals;
  const int g = cfg_.gram;
  const int ctx_len = static_cast<int>(std::min<int64_t>(cfg_.match_context, r.text_len));
  const int32_t* ctx = r.ctx.data() + r.ctx.size() - ctx_len;
  const int32_t M = ctx_len - 1;  // arctic matches m < len(context)
  Candidate cands[kNumSources];
  int nc = 0;
  auto keep = [&](Candidate& c) { return c.d.n > 0 && c.d.match_len >= cfg_.min_match_len; };
  // Own-sequence state in a live automaton: the request's own text always contains its context.
  auto live_state = [&](const Automaton& a, const Automaton::Cursor& cur, int64_t seq_len, int32_t& v, int32_t& ell) {
    if (seq_len >= ctx_len) {
      ell = M;
      v = down_to(a, cur.ptr, M);
    } else {
      match_tail(a, ctx, ctx_len, r.text_len, cfg_.match_context, v, ell);
    }
  };
  // Own-sequence state in a sibling / batch automaton that lacks the row's newest `lag` tokens while they wait for
  // the ingest thread (defer_shared_ingest): the state of the suffix the automaton holds (seq_len tokens of the
  // sequence), advanced over them with the capped matching step, as a history match is (sync_history). Only the
  // shared automata are read one step late: the matched context is the row's current one.
  auto group_state = [&](const Automaton& a, const Automaton::Cursor& cur, int64_t seq_len, int64_t lag, int32_t& v,
                         int32_t& ell) {
    if (lag == 0) return live_state(a, cur, seq_len, v, ell);
    const int64_t held = r.text_len - lag;  // text length the automaton holds
    const int32_t cap0 = static_cast<int32_t>(std::min<int64_t>(cfg_.match_context - 1, held - 1));
    if (lag >= ctx_len || cap0 < 0 || seq_len < cap0) {
      match_tail(a, ctx, ctx_len, r.text_len, cfg_.match_context, v, ell);
      return;
    }
    ell = cap0;  // the sequence itself holds its last cap0 tokens
    v = down_to(a, cur.ptr, cap0);
    for (int64_t i = lag; i > 0; --i) {
      const int64_t L = r.text_len - i + 1;
      advance(a, v, ell, ctx[ctx_len - i], static_cast<int32_t>(std::min<int64_t>(cfg_.match_context - 1, L - 1)));
    }
  };
  auto gram_key_of = [&](int32_t first) {
    int32_t buf[64];
    std::copy(ctx + ctx_len - (g - 1), ctx + ctx_len, buf);
    buf[g - 1] = first;
    return gram_key(buf, g);
  };
  // 1. problem history
  if (cfg_.use_problem && psnap) {
    sync_history(r, *psnap, r.hm[0]);
    Candidate& c = cands[nc];
    c.source = kProblem;
    speculate(*psnap, r.hm[0].v, r.hm[0].ell, k, sp_, c.d);
    if (keep(c)) {
      c.support = snapshot_support(*psnap, c.d, ctx, ctx_len);
      ++nc;
    }
  }
  // 2. running siblings, 3. own text, 4. running batch
  for (int which : {0, -1, 1}) {
    if (which < 0) {
      if (!r.local) continue;
      Candidate& c = cands[nc];
      c.source = kLocal;
      int32_t v = 0, ell = 0;
      live_state(*r.local, r.local_cur, r.text_len, v, ell);
      speculate(*r.local, v, ell, k, sp_, c.d);
      if (!keep(c)) continue;
      c.support = 0;
      if (ctx_len >= g - 1) {
        int32_t u = 0;
        if (c.d.match_len >= g - 1) {
          int32_t tok = 0, t1 = 0;
          r.local->best(c.d.state, tok, t1);
          u = down_to(*r.local, t1, g);
        } else {
          u = 0;
          for (int i = ctx_len - (g - 1); i < ctx_len && u >= 0; ++i) u = r.local->find(u, ctx[i]);
          if (u >= 0) u = r.local->find(u, c.d.tokens[0]);
        }
        if (u > 0) c.support = r.local->cnt(u);
      }
      ++nc;
      continue;
    }
    if (r.seq < 0) continue;
    LivePool::Group* grp = pool_.group_of(r.seq, which);
    if (!grp || grp->nonempty <= 1) continue;
    const LivePool::Seq& sq = pool_.seq(r.seq);
    Candidate& c = cands[nc];
    c.source = which == 0 ? kSiblings : kBatch;
    int32_t v = 0, ell = 0;
    const int64_t lag = pool_.lag(r.seq, which);
    group_state(grp->sam, sq.cursor[which], sq.held[which], lag, v, ell);
    speculate(grp->sam, v, ell, k, sp_, c.d, lag > 0 ? 1 : 0);
    if (!keep(c)) continue;
    c.support = 0;
    if (ctx_len >= g - 1) {
      const uint64_t h = gram_key_of(c.d.tokens[0]);
      const int32_t* cnt = grp->gram_counts.find(h);
      c.support = (cnt ? *cnt : 0) - (pool_.counts_own_gram(r.seq, which, h) ? 1 : 0);
    }
    ++nc;
  }
  // 5. global history
  if (cfg_.use_global && gsnap) {
    sync_history(r, *gsnap, r.hm[1]);
    Candidate& c = cands[nc];
    c.source = kGlobal;
    speculate(*gsnap, r.hm[1].v, r.hm[1].ell, k, sp_, c.d);
    if (keep(c)) {
      c.support = snapshot_support(*gsnap, c.d, ctx, ctx_len);
      ++nc;
    }
  }
  // Evidence-weighted, calibrated choice (arbitration.py): a_i = p_i * n/(n+kappa) * m/(m+mu), calibrated, cut at
  // the first estimate below min_token_prob; the largest sum wins, ties to the earlier source.
  // cands are in source order already (problem, siblings, local, batch, global).
  double prior[kMaxSpec], acc[kMaxSpec];
  double best_score = 0.0;
  int best = -1, best_n = 0;
  double best_prior[kMaxSpec], best_acc[kMaxSpec];
  for (int ci = 0; ci < nc; ++ci) {
    const Candidate& c = cands[ci];
    const int m = c.d.match_len;
    double conf = 0.0;
    if (m > 0) {
      const double s = static_cast<double>(std::max<int64_t>(c.support, 1));
      conf = s / (s + cfg_.kappa) * static_cast<double>(m) / (static_cast<double>(m) + cfg_.mu);
    }
    for (int i = 0; i < c.d.n; ++i) prior[i] = static_cast<double>(c.d.probs[i]) * conf;
    int na = c.d.n;
    if (cfg_.calibrate) {
      na = cal_.calibrate(c.source, m, prior, c.d.n, cfg_.truncate_by_evidence ? cfg_.min_token_prob : 0.0, acc);
    } else {
      for (int i = 0; i < na; ++i) acc[i] = prior[i];
    }
    int cnt = 0;
    for (; cnt < std::min(na, c.d.n); ++cnt) {
      const double test = cfg_.truncate_by_evidence ? acc[cnt] : static_cast<double>(c.d.probs[cnt]);
      if (test < cfg_.min_token_prob || acc[cnt] <= 0.0) break;
    }
    if (cnt == 0) continue;
    double score = 0.0;
    for (int i = 0; i < cnt; ++i) score += acc[i];
    if (best < 0 || score > best_score) {
      best = ci;
      best_score = score;
      best_n = cnt;
      std::copy(prior, prior + cnt, best_prior);
      std::copy(acc, acc + cnt, best_acc);
    }
  }
  if (best < 0) return;
  const Candidate& c = cands[best];
  std::copy(c.d.tokens, c.d.tokens + best_n, out.tokens);
  std::copy(best_acc, best_acc + best_n, out.accept);
  out.length = best_n;
  out.source = static_cast<int8_t>(c.source);
  out.match_len = c.d.match_len;
  h.pend_n = best_n;
  r.pend_source = c.source;
  r.pend_match = c.d.match_len;
  std::copy(best_prior, best_prior + best_n, r.pend_prior);
  ++ctr.drafts;
  ctr.draft_tokens += best_n;
  ++ctr.wins[c.source];
}

void Drafter::begin_listing() {
  if (++list_epoch_ == 0) {  // wrapped: no slot may look listed in this call
    for (Hot& h : hot_) h.listed = h.drafts_in = 0;
    list_epoch_ = 1;
  }
}

Drafter::Hot& Drafter::list_once(int32_t slot, int64_t row, const char* call) {
  // A slot listed twice would be appended or drafted twice, on the drafting threads by two tasks at once.
  Hot& h = hot_[slot];
  if (h.listed == list_epoch_)
    throw InputError(std::string(call) + ": request slot " + std::to_string(slot) + " is listed twice (row " +
                     std::to_string(row) + " and an earlier row)");
  h.listed = list_epoch_;
  return h;
}

void Drafter::propose(const int32_t* slots, const int32_t* budgets, int64_t n, int32_t* tokens, double* accept,
                      int32_t* lengths, int8_t* source, int32_t* match_len, int fill_idle) {
  Lock lk = lock_synced();
  begin_listing();
  for (int64_t i = 0; i < n; ++i) {
    req(slots[i]);
    list_once(slots[i], i, "propose");
  }
  propose_rows(slots, budgets, n, tokens, accept, lengths, source, match_len, fill_idle);
}

void Drafter::prefetch_row(const Request& r, const Snapshot* psnap, const Snapshot* gsnap) const {
  __builtin_prefetch(r.ctx.data() + (r.ctx.empty() ? 0 : r.ctx.size() - 1));
  if (r.local) r.local->prefetch(r.local_cur.ptr), r.local->prefetch(r.local_cur.last);
  if (psnap && r.hm[0].version == psnap->version()) psnap->prefetch(r.hm[0].v);
  if (gsnap && r.hm[1].version == gsnap->version()) gsnap->prefetch(r.hm[1].v);
  if (r.seq >= 0) {
    const LivePool::Seq& sq = pool_.seq(r.seq);
    for (int w = 0; w < 2; ++w) {
      const LivePool::Group* g = pool_.peek_group(r.seq, w);
      if (g) g->sam.prefetch(sq.cursor[w].ptr), g->sam.prefetch(sq.cursor[w].last);
    }
  }
}

void Drafter::propose_rows(const int32_t* slots, const int32_t* budgets, int64_t n, int32_t* tokens, double* accept,
                           int32_t* lengths, int8_t* source, int32_t* match_len, int fill_idle) {
  const int K = cfg_.max_spec_tokens;
  for (int64_t i = 0; i < n; ++i) req(slots[i]);  // validate every row before changing any state
  // Rows that do not draft: "no draft" and nothing else (no snapshot, no group check, no search).
  draft_rows_.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (budgets[i] > 0) {
      draft_rows_.push_back(static_cast<int32_t>(i));
      continue;
    }
    hot_[slots[i]].pend_n = -1;  // a draft never reported verified teaches nothing
    no_draft(i, K, tokens, accept, lengths, source, match_len, fill_idle);
  }
  const int64_t m = static_cast<int64_t>(draft_rows_.size());
  if (m == 0) return;
  const int32_t* dr = draft_rows_.data();
  keys_buf_.resize(m + 1);
  for (int64_t j = 0; j < m; ++j) keys_buf_[j] = reqs_[slots[dr[j]]].problem;
  keys_buf_[m] = HistoryIndex::kGlobalKey;
  history_.get_many(keys_buf_.data(), keys_buf_.size(), snaps_buf_);
  const Snapshot* gsnap = snaps_buf_[m].get();
  // Groups that lost members are rebuilt before the rows are drafted in parallel (drafting only reads them).
  for (int64_t j = 0; j < m; ++j) {
    const int32_t seq = reqs_[slots[dr[j]]].seq;
    if (seq >= 0) pool_.group_of(seq, 0), pool_.group_of(seq, 1);
  }
  const int threads = workers_ ? workers_->threads() : 1;
  worker_ctr_.assign(threads, Counters());
  auto rows = [&](int64_t begin, int64_t end, int w) {
    for (int64_t j = begin; j < end; ++j) {
      if (j + 2 < end) prefetch_row(reqs_[slots[dr[j + 2]]], snaps_buf_[j + 2].get(), gsnap);
      const int64_t i = dr[j];
      RowOut out;
      out.tokens = tokens + i * K;
      out.accept = accept + i * K;
      // The row is written whole: its draft, then zeros (only over the previous draft with kFillPrevious).
      const int64_t was = fill_idle == kFillPrevious ? std::min<int64_t>(std::max<int32_t>(lengths[i], 0), K) : K;
      propose_row(reqs_[slots[i]], budgets[i], snaps_buf_[j].get(), gsnap, out, worker_ctr_[w]);
      if (was > out.length) {
        std::fill(out.tokens + out.length, out.tokens + was, 0);
        std::fill(out.accept + out.length, out.accept + was, 0.0);
      }
      lengths[i] = out.length;
      source[i] = out.source;
      match_len[i] = out.match_len;
    }
  };
  if (workers_) workers_->run(m, rows); else rows(0, m, 0);
  for (const Counters& c : worker_ctr_) {
    ctr_.proposals += c.proposals;
    ctr_.drafts += c.drafts;
    ctr_.draft_tokens += c.draft_tokens;
    for (int s = 0; s < kNumSources; ++s) ctr_.wins[s] += c.wins[s];
  }
  snaps_buf_.clear();  // do not keep superseded snapshots alive between steps
}

void Drafter::record_acceptance(int32_t slot, int64_t accepted, int64_t verified) {
  Lock lk = lock_synced();
  record_locked(req(slot), accepted, verified);
}

void Drafter::step(const int32_t* matrix, int64_t rows_in_matrix, int64_t row_len, const int32_t* slots,
                   const int32_t* rows, const int32_t* num_tokens, const int32_t* num_prompt,
                   const int32_t* num_sampled, const int32_t* num_verified, const int32_t* budgets, int64_t n,
                   int32_t* tokens, double* accept, int32_t* lengths, int8_t* source, int32_t* match_len,
                   int fill_idle, bool release) {
  const bool busy = ingesting_.load(std::memory_order_relaxed);  // the thread is at work: this waits for it
  Lock lk(mu_);
  if (busy) ++ingest_.waits;
  bool drafting = false;
  begin_listing();
  constexpr int64_t kAhead = 8;  // rows are scattered (a slot's record, a matrix row per request): fetch ahead
  for (int64_t i = 0; i < n; ++i) {  // validate every row before changing any state
    if (i + kAhead < n) {
      const int64_t a = i + kAhead;
      if (slots[a] >= 0 && slots[a] < static_cast<int32_t>(hot_.size())) __builtin_prefetch(&hot_[slots[a]]);
      if (rows[a] >= 0 && rows[a] < rows_in_matrix && num_tokens[a] > 0 && num_tokens[a] <= row_len)
        __builtin_prefetch(matrix + static_cast<int64_t>(rows[a]) * row_len + num_tokens[a] - 1);
    }
    req(slots[i]);
    if (rows[i] < 0 || rows[i] >= rows_in_matrix || num_prompt[i] < 0 || num_prompt[i] > num_tokens[i] ||
        num_tokens[i] > row_len || num_sampled[i] < 0)
      throw InputError("step: row " + std::to_string(i) + " has matrix row " + std::to_string(rows[i]) +
                       ", num_prompt " + std::to_string(num_prompt[i]) + ", num_tokens " +
                       std::to_string(num_tokens[i]) + " (matrix " + std::to_string(rows_in_matrix) + " x " +
                       std::to_string(row_len) + ")");
    Hot& h = list_once(slots[i], i, "step");
    if (budgets[i] > 0) {
      drafting = true;
      h.drafts_in = list_epoch_;
    }
    // Token ids this row will append (all of it when it restarts): a negative id would corrupt the automata, where
    // -1 means "no transition" (extend_request checks the same in Python).
    const int64_t out_len = static_cast<int64_t>(num_tokens[i]) - num_prompt[i];
    const int64_t from = (h.seen > out_len || h.prompt_len != num_prompt[i]) ? 0 : num_prompt[i] + h.seen;
    const int32_t* text = matrix + static_cast<int64_t>(rows[i]) * row_len;
    for (int64_t p = from; p < num_tokens[i]; ++p)
      if (text[p] < 0)
        throw InputError("step: row " + std::to_string(i) + " has token id " + std::to_string(text[p]) +
                         " at position " + std::to_string(p) + " (ids must be in [0, 2**31))");
  }
  const bool threaded = ingest_thread_.joinable();
  // No row drafts: every row's new tokens go to the ingest thread, behind what earlier steps left there (nothing
  // reads the automata before the next drafting step or state call, which completes them all first).
  const bool defer = threaded && !drafting;
  // A drafting step with defer_shared_ingest: only what its drafts read now is done now (the drafting rows' own
  // text); the idle rows' tokens and the shared sibling / batch automata's catch-up with the drafting rows' tokens
  // go to the thread, so drafts read the other rows' newest tokens one step late (propose_row: group_state).
  const bool late = threaded && drafting && cfg_.defer_shared_ingest;
  const bool late_idle = threaded && drafting && (cfg_.defer_shared_ingest || cfg_.defer_idle_rows);
  // A drafting step reads the automata: every earlier step's deferred work is completed first (usually the thread
  // did it during the forward pass), so no draft ever reads a half-appended automaton. Requests started since the
  // last step go behind it; with late_idle only the drafting ones are built now, the idle ones' prompts wait for the
  // thread like the idle rows' tokens.
  if (drafting && late_idle) {
    ingest_queue_locked();
    if (!start_rows_.empty()) queue_starts_locked(true);
  } else if (drafting) {
    sync_locked();
  } else if (!start_rows_.empty()) {
    queue_starts_locked(false);
  }
  if (defer_tokens_.size() > kMaxQueuedTokens) sync_locked();  // a thread that cannot keep up: the caller catches up
  const int K = cfg_.max_spec_tokens;
  bool deferred = false;
  // A drafting step on several drafting threads appends its rows' tokens there (the same automata as appending
  // them here row by row: each automaton gets its rows in order), when it has enough rows to be worth the threads.
  size_t appending = 0;
  if (workers_ && drafting && !late && !defer) {
    for (int64_t i = 0; i < n && appending < kMinParallelExtends; ++i) {
      const Hot& h = hot_[slots[i]];
      appending += !(late_idle && budgets[i] <= 0) && h.seen < static_cast<int64_t>(num_tokens[i]) - num_prompt[i] &&
                   h.prompt_len == num_prompt[i];
    }
  }
  const bool parallel_extend = appending >= kMinParallelExtends;
  try {
    for (int64_t i = 0; i < n; ++i) {
      Hot& h = hot_[slots[i]];
      const int32_t* text = matrix + static_cast<int64_t>(rows[i]) * row_len;
      const int64_t num_output = static_cast<int64_t>(num_tokens[i]) - num_prompt[i];
      if (h.seen > num_output || h.prompt_len != num_prompt[i]) {
        // Preempted and recomputed from a shorter state (or a new prompt): start over from the prompt. What is
        // deferred (earlier steps, rows before this one) is ingested first, so the automata see the synchronous order.
        if (!extend_queue_.empty()) run_queued_extends();
        sync_locked();
        Request& r = reqs_[slots[i]];
        const uint64_t problem = r.problem;
        stop_locked(r);
        start_locked(slots[i], text, num_prompt[i], problem);
      } else if (h.pend_n > 0 && num_sampled[i] > 0) {
        int64_t verified = h.pend_n;
        if (num_verified[i] >= 0) verified = std::min<int64_t>(verified, num_verified[i]);
        record_locked(reqs_[slots[i]], std::min<int64_t>(verified, num_sampled[i] - 1), verified);
      }
      const int64_t known = h.seen;
      const int64_t fresh = num_output - known;
      if (fresh > 0) {
        const int32_t* from = text + num_prompt[i] + known;
        h.seen = num_output;
        if (defer || (late_idle && budgets[i] <= 0)) {
          defer_row(slots[i], from, fresh, Deferred::kAll);
          deferred = true;
        } else if (late) {
          // A drafting row: its own text now (its own automaton, context, history matches), the shared automata on
          // the thread; until then its match there is advanced over these tokens (group_state).
          if (i + 2 < n) prefetch_row(reqs_[slots[i + 2]], nullptr, nullptr);
          Request& r = reqs_[slots[i]];
          extend_own_locked(r, from, fresh);
          if (r.seq >= 0) {
            pool_.extend(r.seq, from, fresh, late_groups_);
            defer_row(slots[i], nullptr, 0, Deferred::kShared);
            deferred = true;
          }
        } else if (parallel_extend) {
          queue_extend(slots[i], from, fresh);
        } else {
          if (i + 2 < n) prefetch_row(reqs_[slots[i + 2]], nullptr, nullptr);
          extend_locked(reqs_[slots[i]], from, fresh);
        }
      }
      if (defer) {  // no row drafts: what propose_rows writes for a row without a budget
        h.pend_n = -1;
        no_draft(i, K, tokens, accept, lengths, source, match_len, fill_idle);
      }
    }
  } catch (...) {  // the queued rows' tokens are in their live sequences already: their groups too
    if (!extend_queue_.empty()) run_queued_extends();
    throw;
  }
  if (!extend_queue_.empty()) run_queued_extends();
  if (!defer) propose_rows(slots, budgets, n, tokens, accept, lengths, source, match_len, fill_idle);
  if (!deferred) return;
  ++ingest_.deferred_steps;
  if (!release) return;  // the caller releases it (release_ingest) after its own calls that need no automata
  offer_ingest_locked(lk);
}

void Drafter::trim(const int32_t* slots, const int32_t* lengths, int64_t n) {
  // Outstanding drafts only (no automaton): a deferred ingest need not be completed first, so a trim right after a
  // step does not take it back onto the caller's thread.
  Lock lk(mu_);
  for (int64_t i = 0; i < n; ++i) req(slots[i]);  // validate every slot before changing any draft
  for (int64_t i = 0; i < n; ++i) {
    Request& r = req(slots[i]);
    Hot& h = hot(r);
    const int keep = std::max(0, lengths[i]);
    if (h.pend_n <= keep) continue;
    ctr_.draft_tokens -= h.pend_n - keep;
    if (keep == 0) {
      --ctr_.drafts;
      --ctr_.wins[r.pend_source];
      h.pend_n = -1;
    } else {
      h.pend_n = keep;
    }
  }
}

void Drafter::record_locked(Request& r, int64_t accepted, int64_t verified) {
  Hot& h = hot(r);
  if (h.pend_n < 0) return;
  int n = h.pend_n;
  if (verified >= 0) n = static_cast<int>(std::min<int64_t>(n, verified));
  h.pend_n = -1;
  ++ctr_.verified_drafts;
  ctr_.verified_tokens += n;
  ctr_.accepted_tokens += std::min<int64_t>(std::max<int64_t>(accepted, 0), n);
  if (cfg_.calibrate && n > 0)
    cal_.observe(r.pend_source, r.pend_match, r.pend_prior, n,
                 static_cast<int>(std::min<int64_t>(std::max<int64_t>(accepted, -1), 1 << 30)));
}

void Drafter::release_finished(const std::vector<uint64_t>& problems) {
  Lock lk = lock_synced();
  pool_.release_finished(problems);
}

void Drafter::new_step() {
  std::lock_guard<std::mutex> lk(mu_);
  if (cfg_.calibrate) cal_.new_step();
}

void Drafter::reset_requests() {
  std::lock_guard<std::mutex> lk(mu_);  // waits for an ingest in progress; what is still deferred is dropped
  defer_rows_.clear();
  defer_tokens_.clear();
  start_rows_.clear();
  start_tokens_.clear();
  ingest_error_ = nullptr;
  reqs_.clear();
  hot_.clear();
  pool_.clear();
  active_ = 0;
  ctr_ = Counters();
  cal_ = Calibrator(cfg_.cal_bins, cfg_.cal_pseudocount, cfg_.cal_cap, cfg_.cal_decay);
}

Drafter::Counters Drafter::counters() const {
  std::lock_guard<std::mutex> lk(mu_);
  return ctr_;
}

int64_t Drafter::calibration_tokens() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cal_.observed_tokens();
}

double Drafter::calibration_ratio(int source, int bucket, int position, int bin) const {
  if (!(source >= 0 && source < kNumSources && bucket >= 0 && bucket < Calibrator::kBuckets && position >= 0 &&
        position < Calibrator::kPositions && bin >= 0 && bin < cfg_.cal_bins))
    throw InputError("calibration_ratio: source, bucket, position or bin out of range");
  std::lock_guard<std::mutex> lk(mu_);
  return cal_.ratio(source, bucket, position, bin);
}

Drafter::LiveStats Drafter::live_stats() const {
  Lock lk = lock_synced();
  LiveStats s;
  s.active_requests = active_;
  s.sibling_groups = pool_.sibling_groups();
  s.lingering_finished = pool_.finished_sequences();
  s.running_tokens = pool_.running_tokens();
  s.finished_tokens = pool_.finished_tokens();
  s.rebuilds = pool_.rebuilds();
  s.evicted = pool_.evicted();
  s.evicted_tokens = pool_.evicted_tokens();
  s.group_tokens = pool_.group_tokens();
  size_t b = pool_.bytes();
  std::tie(s.group_appends, s.group_chain_steps) = pool_.walk_totals();
  for (size_t i = 0; i < reqs_.size(); ++i) {
    const Request& r = reqs_[i];
    const bool active = hot_[i].active;
    if (r.local) {
      b += r.local->bytes();
      if (active) s.local_appends += r.local->appends(), s.local_chain_steps += r.local->chain_steps();
    }
    b += r.ctx.capacity() * sizeof(int32_t) + sizeof(Request) + sizeof(Hot);
    if (active) s.local_tokens += r.text_len;
  }
  s.bytes = static_cast<int64_t>(b);
  return s;
}

std::string Drafter::check() const {
  Lock lk = lock_synced();
  std::string g = pool_.check();
  if (!g.empty()) return g;
  for (size_t i = 0; i < reqs_.size(); ++i) {
    if (!hot_[i].active || !reqs_[i].local) continue;
    std::string e = reqs_[i].local->check();
    if (!e.empty()) return "local automaton of slot " + std::to_string(i) + ": " + e;
  }
  return "";
}

}  // namespace das

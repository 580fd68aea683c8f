// The native DAS drafter: requests in slots, five draft sources, evidence-weighted and calibrated arbitration, and
// one batched propose per engine step. A port of das_trl/drafter/drafter.py (the reference implementation) with
// the same semantics: tests compare the two draft for draft (tests/drafter/test_native_equivalence.py).
//
// Per request and round the work is O(new tokens) to advance its match states and automata, plus the draft search
// on each source (speculate.h) for the rows that draft (budget > 0); a row that does not draft costs its validation,
// its verification report and the copy of its new tokens. The Python layer validates input and maps request ids to
// slots.
//
// Deferred ingest (DrafterConfig::background_ingest): a step in which no row drafts copies each row's new tokens into
// a queue and returns; the drafter's ingest thread appends them to the automata (extend_locked: the request's own
// automaton, its sibling and batch groups and their gram sets) while the engine runs its forward pass. Every method
// that reads or writes request state, and every drafting step, first completes that work (sync_locked: if the thread
// has not taken it yet, the caller ingests it itself), so every draft, counter and statistic equals the synchronous
// path's: the tokens are ingested in the same order, between the same other operations. A step where no row drafts
// does not wait for the queue: in a quiet batch the tokens of several steps may wait there (at most
// kMaxQueuedTokens) until the thread takes them or a caller needs the state.
// With DrafterConfig::defer_idle_rows (default), a drafting step leaves the rows without a budget to the thread: their
// new tokens, and the prompts of requests started since the last step that do not draft in it (a new batch's first
// step drafts a few rows; building every row's automata before them was the step's whole cost), so a draft reads the
// other rows' newest text one step late. Started requests wait in start_rows_, out of the thread's reach, until the
// next step decides, so which prompts a draft reads never depends on the thread's timing. With
// DrafterConfig::defer_shared_ingest (off by default) a drafting step keeps on its critical path only what its drafts
// read now: the drafting rows' own text (own automaton, recent tokens, history match states); the shared sibling and
// batch automata's catch-up with the drafting rows' tokens goes to the thread too, so a draft reads every row's
// newest tokens there one step late; a drafting row's own match in those automata is
// advanced over its newest tokens (Request::shared_lag, propose_row's group_state), so its context is current.
// Drafts then differ slightly from the synchronous path's, deterministically (the same inputs give the same drafts,
// whoever ingests the deferred rows).
//
// Waking a sleeping thread costs the waker a system call (~8 us of the engine thread's CPU per step on a small VM),
// so the ingest thread does not sleep between steps: for kIngestPollWindow after its last work (or the last offer of
// tokens it saw, which a caller may have ingested first) it looks every kIngestPollInterval (a short sleep) whether
// something was offered, without taking the lock, and a step that queues tokens while it polls wakes nobody; only
// after a longer pause does it wait on its condition variable, and the next step wakes it.
//
// Thread-safety: every public method takes the drafter's mutex (mu_), and so does the ingest thread for the whole of
// one step's ingest: state has one lock. History snapshots are built on HistoryIndex's own threads and read without
// blocking.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "automaton.h"
#include "calibrator.h"
#include "history_index.h"
#include "live_pool.h"
#include "speculate.h"
#include "worker_pool.h"

namespace das {

struct DrafterConfig {
  int depth = 32;               // max_tree_depth
  int match_context = 32;       // match_context_tokens
  int max_spec_tokens = 16;
  double max_spec_factor = 1.0;
  double max_spec_offset = 0.0;
  double min_token_prob = 0.05;
  int min_match_len = 1;
  bool use_problem = true, use_global = true, use_local = true;
  bool share_siblings = true, share_batch = true;
  int prompt_tail = 32;
  int64_t live_token_budget = 2'000'000;
  int gram = 3;                 // support_ngram
  double kappa = 2.0, mu = 1.0;
  bool truncate_by_evidence = true;
  bool calibrate = true;
  double cal_pseudocount = 8.0, cal_decay = 0.5, cal_cap = 2000.0;
  int cal_bins = 10;
  int builder_threads = 1;
  int draft_threads = 1;        // threads drafting the rows of one engine step (the calling thread included)
  bool background_ingest = true;    // steps where no row drafts leave their tokens to the ingest thread
  bool defer_idle_rows = true;      // ... and drafting steps their rows without a budget
  bool defer_shared_ingest = false;  // ... and all but their drafting rows' own text (see the top)
  int late_groups = 2;               // with it, the shared automata read one step late: 1 siblings, 2 batch, 3 both
  void validate() const;
};

// One row's output of propose.
struct RowOut {
  int32_t* tokens;  // [max_spec_tokens]
  double* accept;   // [max_spec_tokens]
  int32_t length = 0;
  int8_t source = -1;
  int32_t match_len = 0;
};

class Drafter {
 public:
  // How the outputs' tokens / accept rows of rows without a draft are cleared: not at all (the caller's buffers are
  // zero already), whole, or only over each row's previous draft (buffers that hold an earlier step's outputs, each
  // row zero past its length: a quiet step then writes a few bytes per row instead of K tokens and K estimates).
  enum Fill : int { kFillNone = 0, kFillAll = 1, kFillPrevious = 2 };

  explicit Drafter(const DrafterConfig& cfg);
  // Stops the ingest thread (deferred tokens not yet ingested are dropped with the drafter).
  ~Drafter();
  Drafter(const Drafter&) = delete;
  Drafter& operator=(const Drafter&) = delete;

  // Starts a request; with background_ingest its prompt is queued and reaches its automata on the ingest thread.
  void start(int32_t slot, const int32_t* prompt, int64_t n, uint64_t problem);
  void extend(int32_t slot, const int32_t* tokens, int64_t n);
  void stop(int32_t slot);
  bool active(int32_t slot) const;
  uint64_t problem_of(int32_t slot) const;
  // Drafts for n rows: slots[i] active requests, budgets[i] tokens (<= 0: none). Outputs are caller-owned:
  // tokens / accept [n, max_spec_tokens] (row-major), lengths / match_len [n], source [n]. A row that does not draft
  // gets lengths 0, source -1, match_len 0, and its tokens / accept row zeroed as fill_idle says (Fill); a drafting
  // row's is written whole (zero past its length, up to the previous length with kFillPrevious).
  void propose(const int32_t* slots, const int32_t* budgets, int64_t n, int32_t* tokens, double* accept,
               int32_t* lengths, int8_t* source, int32_t* match_len, int fill_idle = kFillAll);
  void record_acceptance(int32_t slot, int64_t accepted, int64_t verified);
  // One engine step for n rows, reading each row's text from a token matrix (vLLM's token_ids_cpu): row i is
  // request slots[i], whose text is matrix[rows[i], :num_tokens[i]] with a prompt of num_prompt[i] tokens and
  // num_sampled[i] tokens gained this step. Reports the verification of the row's previous draft (accepted =
  // min(verified, num_sampled - 1), verified = its draft length, capped by num_verified[i] when >= 0), appends the
  // new output tokens (restarting a request whose output shrank: preemption), then drafts with budgets[i]
  // (outputs as propose's). When no row has a budget > 0 and background_ingest is on, the new tokens are copied and
  // left to the ingest thread (see the top of this file) and step returns without touching the automata; with
  // defer_shared_ingest, a drafting step leaves to it all but the drafting rows' own text.
  void step(const int32_t* matrix, int64_t rows_in_matrix, int64_t row_len, const int32_t* slots, const int32_t* rows,
            const int32_t* num_tokens, const int32_t* num_prompt, const int32_t* num_sampled,
            const int32_t* num_verified, const int32_t* budgets, int64_t n, int32_t* tokens, double* accept,
            int32_t* lengths, int8_t* source, int32_t* match_len, int fill_idle = kFillAll, bool release = true);
  // With release = false, step leaves its deferred tokens queued but not yet offered to the ingest thread (calls
  // that need no automaton, such as trim, then never wait for that ingest); release_ingest offers them. Any call that
  // needs the state still completes them first, so nothing is lost if the caller never releases.
  void release_ingest();
  // Completes any deferred ingest now (benchmarks, tests; every method that needs it does it itself).
  void flush();
  // Tests: while held, the ingest thread takes no work, so each deferred step is completed by the next call that
  // needs the state (the path a caller takes when it comes before the thread).
  void hold_ingest(bool hold);
  // Tests: the ingest thread sleeps this long before each queued row (holding the lock, as it does while it
  // ingests), so that steps arrive while an ingest is in progress; 0: off.
  void set_ingest_delay(int64_t us);
  // Cuts each row's outstanding draft to lengths[i] tokens (what was really sent for verification).
  void trim(const int32_t* slots, const int32_t* lengths, int64_t n);
  void release_finished(const std::vector<uint64_t>& problems);
  void new_step();
  void reset_requests();

  HistoryIndex& history() { return history_; }
  const DrafterConfig& config() const { return cfg_; }

  struct Counters {
    int64_t proposals = 0, drafts = 0, draft_tokens = 0, requests = 0, verified_drafts = 0, verified_tokens = 0,
            accepted_tokens = 0;
    std::array<int64_t, kNumSources> wins{};
  };
  Counters counters() const;
  // The deferred ingest: steps whose ingest was left to the thread, the deferred ingests a caller did itself (the
  // thread had not started: on the critical path), the thread's ingest time (steady clock, seconds) in all and in
  // its last step, its CPU time in all (less than the steady time when it waited for a core), tokens waiting now,
  // and the steps that found the thread ingesting and waited for it to finish.
  // Also: the wake-ups callers made (the thread was parked, not polling) and the thread's whole CPU time (its
  // ingests and its polling).
  struct IngestStats {
    int64_t deferred_steps = 0, caller_ingests = 0, queued_tokens = 0, waits = 0, wakeups = 0;
    double background_seconds = 0.0, last_seconds = 0.0, background_cpu_seconds = 0.0, thread_cpu_seconds = 0.0;
  };
  IngestStats ingest_stats() const;
  int64_t calibration_tokens() const;
  double calibration_ratio(int source, int bucket, int position, int bin) const;
  int calibration_bins() const { return cfg_.cal_bins; }
  struct LiveStats {
    int64_t active_requests = 0, sibling_groups = 0, lingering_finished = 0, running_tokens = 0, finished_tokens = 0,
            local_tokens = 0, bytes = 0, rebuilds = 0, evicted = 0, evicted_tokens = 0, group_tokens = 0, group_appends = 0, group_chain_steps = 0,
            local_appends = 0, local_chain_steps = 0;
  };
  LiveStats live_stats() const;
  std::string check() const;

 private:
  struct HistMatch {
    uint64_t version = 0;  // snapshot the state refers to (0: none)
    int32_t v = 0;
    int32_t ell = 0;
    int64_t pending = 0;   // tokens appended since the state was advanced
  };
  // What a step reads and writes of every row, dense by slot (32 bytes: a cache line holds 2 rows) and never
  // written by the ingest thread, so that a step where no row drafts touches a few contiguous lines per row instead
  // of each request's scattered (and, after a deferred ingest, another core's) state.
  struct Hot {
    int64_t seen = 0;        // output tokens received: ingested (Request::output_len) + waiting in defer_tokens_
    int64_t prompt_len = 0;
    int32_t pend_n = -1;     // unverified draft: length (-1: none); its source, match length, priors in Request
    uint32_t listed = 0;     // the last step / propose call that listed this slot (list_once)
    uint32_t drafts_in = 0;  // the last step call that gave this slot a budget (its list epoch)
    bool active = false;
  };
  struct Request {
    uint64_t problem = 0;
    std::unique_ptr<Automaton> local;
    Automaton::Cursor local_cur;
    std::vector<int32_t> ctx;  // recent tokens (at least the last match_context)
    int64_t text_len = 0, output_len = 0;  // ingested
    int32_t seq = -1;
    HistMatch hm[2];  // [0] problem snapshot, [1] global snapshot
    int pend_source = 0, pend_match = 0;
    double pend_prior[kMaxSpec];
  };
  struct Candidate {
    int source;
    RawDraft d;
    int64_t support;
  };
  struct Deferred {  // one row of a deferred step: the request and its new tokens in defer_tokens_
    // its tokens everywhere / the shared automata's catch-up (no tokens) / a started request's prompt
    enum : uint8_t { kAll = 0, kShared = 1, kStart = 2 };
    int32_t slot;
    uint8_t what;
    int64_t begin, n;
  };
  // The most tokens the queue holds before a step completes it on the caller's thread (a thread that cannot keep up).
  static constexpr size_t kMaxQueuedTokens = size_t{1} << 22;
  // The ingest thread's polling (see the top): how often it looks for queued tokens (the latency it adds to an ingest,
  // far below a forward pass), and for how long after its last work before it parks (longer than an engine step:
  // a decoding batch never wakes it; its cost, a short sleep's wake-up every interval: ~2 % of a core on a small VM).
  static constexpr std::chrono::microseconds kIngestPollInterval{1000};
  static constexpr std::chrono::milliseconds kIngestPollWindow{100};
  using Lock = std::unique_lock<std::mutex>;

  Request& req(int32_t slot);
  const Request& req(int32_t slot) const;
  Hot& hot(const Request& r) { return hot_[&r - reqs_.data()]; }
  void sync_history(Request& r, const Snapshot& s, HistMatch& hm) const;
  int64_t snapshot_support(const Snapshot& s, const RawDraft& d, const int32_t* ctx, int ctx_len) const;
  void propose_row(Request& r, int budget, const Snapshot* problem_snap, const Snapshot* global_snap, RowOut& out,
                   Counters& ctr);
  // Prefetch the states an upcoming row will touch first (rows are independent: their data is scattered in memory).
  void prefetch_row(const Request& r, const Snapshot* psnap, const Snapshot* gsnap) const;
  void start_locked(int32_t slot, const int32_t* prompt, int64_t n, uint64_t problem);
  // start_locked's two halves: the request's slot state (at once) and its automata / context (possibly deferred).
  void register_locked(int32_t slot, int64_t n, uint64_t problem);
  void build_locked(Request& r, const int32_t* prompt, int64_t n);
  void extend_locked(Request& r, const int32_t* tokens, int64_t n);
  void extend_own_locked(Request& r, const int32_t* tokens, int64_t n);
  void extend_shared_locked(Request& r, const int32_t* tokens, int64_t n);
  // A drafting step's rows queued by queue_extend: their automata appended on the drafting threads (extend_locked's
  // result: own automata one task per row, each shared automaton one task in row order), then cleared.
  void queue_extend(int32_t slot, const int32_t* tokens, int64_t n);
  void run_queued_extends();
  // A call's slots each listed once (step, propose): begin_listing() per call, then list_once per row (InputError
  // naming `call` for a slot listed twice; the slot must be valid).
  void begin_listing();
  Hot& list_once(int32_t slot, int64_t row, const char* call);
  // Queues n new tokens of the request in slot for the ingest thread (what: Deferred::kAll or kShared).
  void defer_row(int32_t slot, const int32_t* tokens, int64_t n, uint8_t what);
  void stop_locked(Request& r);
  void record_locked(Request& r, int64_t accepted, int64_t verified);
  void propose_rows(const int32_t* slots, const int32_t* budgets, int64_t n, int32_t* tokens, double* accept,
                    int32_t* lengths, int8_t* source, int32_t* match_len, int fill_idle);
  // Takes the mutex and completes the deferred ingest (the lock every request-state method starts with; const
  // methods too: the ingest changes no value they report, it only makes it current).
  Lock lock_synced() const;
  // With mu_ held: ingests the deferred rows (started requests first queued behind them), if any, on this thread;
  // rethrows an error of the ingest thread.
  void sync_locked();
  // With mu_ held: ingests what is queued (not start_rows_) on this thread; rethrows an error of the ingest thread.
  void ingest_queue_locked();
  // With mu_ held: the requests started since the last step into the ingest queue, behind what is there; with
  // build_drafting, those this step drafts (Hot::drafts_in) are built here and now instead.
  void queue_starts_locked(bool build_drafting);
  // background: on the ingest thread (then the history matches of rows that drafted before catch up too).
  void ingest_deferred_locked(bool background = false);
  void catch_up_history_locked();
  void ingest_loop();
  // With mu_ held (lk): offers the queued tokens to the ingest thread, waking it only when it is parked (unlocks lk
  // then).
  void offer_ingest_locked(Lock& lk);

  DrafterConfig cfg_;
  SpecParams sp_;
  mutable std::mutex mu_;
  std::vector<Request> reqs_;
  std::vector<Hot> hot_;  // by slot, as reqs_
  uint32_t list_epoch_ = 0;  // step / propose calls so far (Hot::listed)
  LivePool pool_;
  HistoryIndex history_;
  Calibrator cal_;
  Counters ctr_;
  int64_t active_ = 0;
  std::vector<std::shared_ptr<const Snapshot>> snaps_buf_;
  std::unique_ptr<WorkerPool> workers_;
  std::vector<Counters> worker_ctr_;
  std::vector<uint64_t> keys_buf_;
  std::vector<int32_t> draft_rows_;  // rows of the current call that draft
  struct QueuedExtend {
    int32_t slot;
    const int32_t* tokens;  // the caller's token matrix (valid for the step)
    int64_t n;
  };
  std::vector<QueuedExtend> extend_queue_;  // this step's drafting rows, appended in parallel before they draft
  unsigned late_groups_ = 0;         // LivePool::extend's `late` for drafting rows (defer_shared_ingest)
  // Deferred ingest (guarded by mu_): one step's rows and tokens, the thread, its wake-up and accounting.
  std::vector<Deferred> defer_rows_;
  std::vector<int32_t> behind_;  // the ingest thread's rows whose history matches catch up (catch_up_history_locked)
  std::vector<uint64_t> keys_bg_;
  std::vector<std::shared_ptr<const Snapshot>> snaps_bg_;
  std::vector<int32_t> defer_tokens_;
  // Requests started since the last step (guarded by mu_; the thread never takes them): their prompts, the Deferred
  // entries' `begin` indexing start_tokens_. At most the prompts of one step's new requests.
  std::vector<Deferred> start_rows_;
  std::vector<int32_t> start_tokens_;
  std::vector<Deferred> starting_;  // queue_starts_locked's list, taken out first (an error cannot run it twice)
  std::condition_variable ingest_cv_;
  bool ingest_stop_ = false, ingest_hold_ = false;
  bool ingest_ready_ = false;
  bool ingest_parked_ = false;  // the thread waits on ingest_cv_ (not polling): offering work must wake it
  // Offers of queued tokens, hold changes and the stop, counted (written under mu_): the polling thread reads it
  // without the lock and keeps polling while offers keep coming.
  std::atomic<uint64_t> ingest_events_{0};
  std::atomic<bool> ingesting_{false};  // the thread is ingesting (read without the lock: IngestStats::waits)
  int64_t ingest_delay_us_ = 0;  // the queued tokens are offered to the thread (step with release, release_ingest)
  std::exception_ptr ingest_error_;
  IngestStats ingest_;
  std::thread ingest_thread_;  // last member: started when every other member exists
};

}  // namespace das

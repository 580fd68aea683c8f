// Python bindings of the native drafter core (nanobind). The only file that knows about Python: arrays are
// borrowed for the duration of a call (const inputs accept read-only arrays), history token arrays are copied
// before the call returns, and the GIL is released for the batched propose and step, for every call that may wait
// for the drafter's ingest thread (it holds the drafter's mutex while it ingests a deferred step), and while waiting
// for history builds.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "controller.h"
#include "drafter.h"
#include "request_book.h"
#include "selftest.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

template <class T>
using In1 = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <class T>
using Out1 = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <class T>
using Out2 = nb::ndarray<T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

template <class T>
T get(const nb::dict& d, const char* key, T fallback) {
  if (!d.contains(key)) return fallback;
  return nb::cast<T>(d[key]);
}

das::DrafterConfig config_from(const nb::dict& d) {
  das::DrafterConfig c;
  c.depth = get<int>(d, "max_tree_depth", c.depth);
  c.match_context = get<int>(d, "match_context_tokens", c.match_context);
  c.max_spec_tokens = get<int>(d, "max_spec_tokens", c.max_spec_tokens);
  c.max_spec_factor = get<double>(d, "max_spec_factor", c.max_spec_factor);
  c.max_spec_offset = get<double>(d, "max_spec_offset", c.max_spec_offset);
  c.min_token_prob = get<double>(d, "min_token_prob", c.min_token_prob);
  c.min_match_len = get<int>(d, "min_match_len", c.min_match_len);
  c.use_problem = get<bool>(d, "use_problem_tree", c.use_problem);
  c.use_global = get<bool>(d, "use_global_tree", c.use_global);
  c.use_local = get<bool>(d, "use_local_tree", c.use_local);
  c.share_siblings = get<bool>(d, "share_running_siblings", c.share_siblings);
  c.share_batch = get<bool>(d, "share_running_batch", c.share_batch);
  c.prompt_tail = get<int>(d, "prompt_tail_tokens", c.prompt_tail);
  c.live_token_budget = get<int64_t>(d, "live_token_budget", c.live_token_budget);
  c.gram = get<int>(d, "support_ngram", c.gram);
  c.kappa = get<double>(d, "evidence_pseudocount", c.kappa);
  c.mu = get<double>(d, "match_len_pseudocount", c.mu);
  c.truncate_by_evidence = get<bool>(d, "truncate_by_evidence", c.truncate_by_evidence);
  c.calibrate = get<bool>(d, "calibrate_acceptance", c.calibrate);
  c.cal_pseudocount = get<double>(d, "calibration_pseudocount", c.cal_pseudocount);
  c.cal_decay = get<double>(d, "calibration_step_decay", c.cal_decay);
  c.builder_threads = get<int>(d, "builder_threads", c.builder_threads);
  c.draft_threads = get<int>(d, "draft_threads", c.draft_threads);
  c.background_ingest = get<bool>(d, "background_ingest", c.background_ingest);
  c.defer_idle_rows = get<bool>(d, "defer_idle_rows", c.defer_idle_rows);
  c.defer_shared_ingest = get<bool>(d, "defer_shared_ingest", c.defer_shared_ingest);
  c.late_groups = get<int>(d, "late_shared_groups", c.late_groups);
  return c;
}

struct SlotError : std::exception {
  std::string msg;
  explicit SlotError(std::string m) : msg(std::move(m)) {}
  const char* what() const noexcept override { return msg.c_str(); }
};

template <class F>
auto slot_guard(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::out_of_range& e) {
    throw SlotError(e.what());
  }
}

void need_rows(const char* what, size_t got, size_t n) {
  if (got != n)
    throw das::InputError(std::string(what) + " must have " + std::to_string(n) + " rows, got " + std::to_string(got));
}

// Row counts that must match a reference array's (the message names both).
void need_rows_like(const char* what, size_t got, const char* ref, size_t n) {
  if (got != n)
    throw das::InputError(std::string(what) + " has " + std::to_string(got) + " rows but " + ref + " has " +
                          std::to_string(n));
}

using Matrix = nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// A step's five output arrays (a DraftBatch), held with their references: the Speculator writes every step into the
// same views, so it converts them once (a StepOutputs) instead of five array conversions per step (~0.2 us each).
struct StepOutputs {
  Out2<int32_t> tokens;
  Out2<double> accept;
  Out1<int32_t> lengths;
  Out1<int8_t> source;
  Out1<int32_t> match_len;
};

// Drafter::step after the binding's checks (every length, the output width, fill_idle), the GIL released.
void run_step(das::Drafter& d, const Matrix& matrix, const In1<int32_t>& slots, const In1<int32_t>& rows,
              const In1<int32_t>& num_tokens, const In1<int32_t>& num_prompt, const In1<int32_t>& num_sampled,
              const In1<int32_t>& num_verified, const In1<int32_t>& budgets, const StepOutputs& out, int fill_idle,
              bool release) {
  const size_t n = slots.shape(0);
  const size_t K = static_cast<size_t>(d.config().max_spec_tokens);
  for (auto [name, got] : {std::pair<const char*, size_t>{"rows", rows.shape(0)},
                           {"num_tokens", num_tokens.shape(0)}, {"num_prompt", num_prompt.shape(0)},
                           {"num_sampled", num_sampled.shape(0)}, {"num_verified", num_verified.shape(0)},
                           {"budgets", budgets.shape(0)}, {"tokens", out.tokens.shape(0)},
                           {"accept", out.accept.shape(0)}, {"lengths", out.lengths.shape(0)},
                           {"source", out.source.shape(0)}, {"match_len", out.match_len.shape(0)}})
    need_rows(name, got, n);
  if (out.tokens.shape(1) != K || out.accept.shape(1) != K)
    throw das::InputError("tokens and accept must have max_spec_tokens = " + std::to_string(K) + " columns");
  if (fill_idle < das::Drafter::kFillNone || fill_idle > das::Drafter::kFillPrevious)
    throw das::InputError("fill_idle must be 0, 1 or 2, got " + std::to_string(fill_idle));
  nb::gil_scoped_release nogil;
  slot_guard([&] {
    d.step(matrix.data(), static_cast<int64_t>(matrix.shape(0)), static_cast<int64_t>(matrix.shape(1)), slots.data(),
           rows.data(), num_tokens.data(), num_prompt.data(), num_sampled.data(), num_verified.data(),
           budgets.data(), static_cast<int64_t>(n), out.tokens.data(), out.accept.data(), out.lengths.data(),
           out.source.data(), out.match_len.data(), fill_idle, release);
  });
}

// The controller kernels' settings from a dict (missing keys keep ControllerParams' defaults).
das::ControllerParams controller_params(const nb::dict& params) {
  das::ControllerParams prm;
  prm.ratio = get<double>(params, "ratio", prm.ratio);
  prm.tail_prior_weight = get<double>(params, "tail_prior_weight", prm.tail_prior_weight);
  prm.c_base_ms = get<double>(params, "c_base_ms", prm.c_base_ms);
  prm.c_tok_ms = get<double>(params, "c_tok_ms", prm.c_tok_ms);
  prm.draft_margin = get<double>(params, "draft_margin", prm.draft_margin);
  prm.pooled_weight = get<double>(params, "pooled_weight", prm.pooled_weight);
  prm.jitter = get<double>(params, "length_jitter", prm.jitter);
  prm.extrapolation_fraction = get<double>(params, "extrapolation_fraction", prm.extrapolation_fraction);
  prm.min_remaining = get<double>(params, "min_remaining", prm.min_remaining);
  prm.bins = get<int>(params, "bins", prm.bins);
  prm.draft_row_ms = get<double>(params, "draft_row_ms", prm.draft_row_ms);
  prm.tau_uncertainty = get<double>(params, "tau_uncertainty", prm.tau_uncertainty);
  if (!(prm.tau_uncertainty >= 0.0)) throw das::InputError("tau_uncertainty must be >= 0");
  if (prm.bins < 1) throw das::InputError("bins must be >= 1");
  return prm;
}

// Shape checks shared by the controller kernels: draws [4, n or 1, s >= 1], a table with at least one column.
void check_samples(size_t n, size_t table_cols, size_t draw_kinds, size_t draw_rows, size_t samples) {
  if (draw_kinds != 4 || (draw_rows != n && draw_rows != 1))
    throw das::InputError("draws must be [4, n, samples] or [4, 1, samples] (the same draws for every row)");
  if (n && table_cols == 0) throw das::InputError("table needs at least one column");
  if (samples == 0) throw das::InputError("draws needs at least one sample");
}

}  // namespace

NB_MODULE(_das_native, m) {
  m.doc() = "Native core of the DAS drafter (see das_trl/drafter/native/__init__.py).";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const SlotError& e) {
      PyErr_SetString(PyExc_KeyError, e.what());
    }
  });
  m.attr("MAX_SPEC_TOKENS") = das::kMaxSpec;

  nb::class_<StepOutputs>(m, "StepOutputs",
                          "A step's five output arrays (DraftBatch: tokens, accept, lengths, source, match_len), "
                          "held for Drafter.step_into; written in place, never converted")
      .def("__init__",
           [](StepOutputs* self, Out2<int32_t> tokens, Out2<double> accept, Out1<int32_t> lengths, Out1<int8_t> source,
              Out1<int32_t> match_len) { new (self) StepOutputs{tokens, accept, lengths, source, match_len}; },
           "tokens"_a.noconvert(), "accept"_a.noconvert(), "lengths"_a.noconvert(), "source"_a.noconvert(),
           "match_len"_a.noconvert());

  nb::class_<das::Drafter>(m, "Drafter")
      .def("__init__", [](das::Drafter* self, const nb::dict& cfg) { new (self) das::Drafter(config_from(cfg)); },
           "config"_a)
      .def("start",
           [](das::Drafter& d, int32_t slot, In1<int32_t> prompt, uint64_t problem) {
             nb::gil_scoped_release nogil;
             d.start(slot, prompt.data(), static_cast<int64_t>(prompt.shape(0)), problem);
           },
           "slot"_a, "prompt"_a, "problem"_a)
      .def("extend",
           [](das::Drafter& d, int32_t slot, In1<int32_t> tokens) {
             nb::gil_scoped_release nogil;
             slot_guard([&] { d.extend(slot, tokens.data(), static_cast<int64_t>(tokens.shape(0))); });
           },
           "slot"_a, "tokens"_a)
      .def("stop",
           [](das::Drafter& d, int32_t slot) {
             nb::gil_scoped_release nogil;
             slot_guard([&] { d.stop(slot); });
           },
           "slot"_a)
      .def("active", &das::Drafter::active, "slot"_a)
      .def("problem_of", [](das::Drafter& d, int32_t slot) { return slot_guard([&] { return d.problem_of(slot); }); },
           "slot"_a)
      .def("propose",
           [](das::Drafter& d, In1<int32_t> slots, In1<int32_t> budgets, Out2<int32_t> tokens, Out2<double> accept,
              Out1<int32_t> lengths, Out1<int8_t> source, Out1<int32_t> match_len, int fill_idle) {
             const size_t n = slots.shape(0);
             const size_t K = static_cast<size_t>(d.config().max_spec_tokens);
             need_rows("budgets", budgets.shape(0), n);
             need_rows("tokens", tokens.shape(0), n);
             need_rows("accept", accept.shape(0), n);
             need_rows("lengths", lengths.shape(0), n);
             need_rows("source", source.shape(0), n);
             need_rows("match_len", match_len.shape(0), n);
             if (tokens.shape(1) != K || accept.shape(1) != K)
               throw das::InputError("tokens and accept must have max_spec_tokens = " + std::to_string(K) +
                                     " columns");
             if (fill_idle < das::Drafter::kFillNone || fill_idle > das::Drafter::kFillPrevious)
               throw das::InputError("fill_idle must be 0, 1 or 2, got " + std::to_string(fill_idle));
             nb::gil_scoped_release nogil;
             slot_guard([&] {
               d.propose(slots.data(), budgets.data(), static_cast<int64_t>(n), tokens.data(), accept.data(),
                         lengths.data(), source.data(), match_len.data(), fill_idle);
             });
           },
           "slots"_a, "budgets"_a, "tokens"_a.noconvert(), "accept"_a.noconvert(), "lengths"_a.noconvert(),
           "source"_a.noconvert(), "match_len"_a.noconvert(),
           "fill_idle"_a = 1)
      .def("step",
           [](das::Drafter& d, const Matrix& matrix, In1<int32_t> slots, In1<int32_t> rows, In1<int32_t> num_tokens,
              In1<int32_t> num_prompt, In1<int32_t> num_sampled, In1<int32_t> num_verified, In1<int32_t> budgets,
              Out2<int32_t> tokens, Out2<double> accept, Out1<int32_t> lengths, Out1<int8_t> source,
              Out1<int32_t> match_len, int fill_idle, bool release) {
             run_step(d, matrix, slots, rows, num_tokens, num_prompt, num_sampled, num_verified, budgets,
                      StepOutputs{tokens, accept, lengths, source, match_len}, fill_idle, release);
           },
           "matrix"_a, "slots"_a, "rows"_a, "num_tokens"_a, "num_prompt"_a, "num_sampled"_a, "num_verified"_a,
           "budgets"_a, "tokens"_a.noconvert(), "accept"_a.noconvert(), "lengths"_a.noconvert(),
           "source"_a.noconvert(), "match_len"_a.noconvert(), "fill_idle"_a = 1,
           "release"_a = true)
      .def("step_into", &run_step, "matrix"_a, "slots"_a, "rows"_a, "num_tokens"_a, "num_prompt"_a,
           "num_sampled"_a, "num_verified"_a, "budgets"_a, "out"_a, "fill_idle"_a = 1, "release"_a = true,
           "step with the output arrays of a StepOutputs (converted once for the steps that reuse them)")
      .def("release_ingest", &das::Drafter::release_ingest)
      .def("flush",
           [](das::Drafter& d) {
             nb::gil_scoped_release nogil;
             d.flush();
           })
      .def("hold_ingest", &das::Drafter::hold_ingest, "hold"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("set_ingest_delay", &das::Drafter::set_ingest_delay, "us"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("ingest_queued_tokens",
           [](das::Drafter& d) {
             nb::gil_scoped_release nogil;
             return d.ingest_stats().queued_tokens;
           })
      .def("trim",
           [](das::Drafter& d, In1<int32_t> slots, In1<int32_t> lengths) {
             need_rows("lengths", lengths.shape(0), slots.shape(0));
             nb::gil_scoped_release nogil;
             slot_guard([&] { d.trim(slots.data(), lengths.data(), static_cast<int64_t>(slots.shape(0))); });
           },
           "slots"_a, "lengths"_a)
      .def("record_acceptance",
           [](das::Drafter& d, int32_t slot, int64_t accepted, int64_t verified) {
             nb::gil_scoped_release nogil;
             slot_guard([&] { d.record_acceptance(slot, accepted, verified); });
           },
           "slot"_a, "accepted"_a, "verified"_a = -1)
      .def("release_finished", &das::Drafter::release_finished, "problems"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("new_step", &das::Drafter::new_step)
      .def("reset_requests", &das::Drafter::reset_requests, nb::call_guard<nb::gil_scoped_release>())
      .def("submit_history",
           [](das::Drafter& d, uint64_t key, In1<int32_t> tokens, In1<int64_t> offsets, In1<int32_t> weights) {
             const size_t n = offsets.shape(0);
             if (n == 0) throw das::InputError("offsets must hold at least one entry (0)");
             if (weights.shape(0) != n - 1)
               throw das::InputError("weights must have one entry per sequence (" + std::to_string(n - 1) + ")");
             das::SequenceSet s;
             s.tokens.assign(tokens.data(), tokens.data() + tokens.shape(0));
             s.offsets.assign(offsets.data(), offsets.data() + n);
             s.weights.assign(weights.data(), weights.data() + n - 1);
             if (s.offsets.front() != 0 || s.offsets.back() != static_cast<int64_t>(s.tokens.size()))
               throw das::InputError("offsets must start at 0 and end at len(tokens)");
             for (size_t i = 0; i + 1 < n; ++i) {
               if (s.offsets[i + 1] < s.offsets[i]) throw das::InputError("offsets must be non-decreasing");
               if (s.weights[i] < 1) throw das::InputError("weights must be >= 1");
             }
             d.history().submit(key, std::move(s));
           },
           "key"_a, "tokens"_a, "offsets"_a, "weights"_a)
      .def("drop_history", [](das::Drafter& d, uint64_t key) { d.history().submit(key, das::SequenceSet()); }, "key"_a)
      .def("wait_history",
           [](das::Drafter& d, double timeout) {
             nb::gil_scoped_release nogil;
             return d.history().wait(timeout);
           },
           "timeout"_a = -1.0)
      .def("clear_history", [](das::Drafter& d) {
        nb::gil_scoped_release nogil;
        d.history().clear();
      })
      .def("stats",
           [](das::Drafter& d) {
             das::Drafter::Counters c;
             das::Drafter::LiveStats l;
             das::Drafter::IngestStats g;
             {
               nb::gil_scoped_release nogil;
               g = d.ingest_stats();  // first: the tokens still queued now
               c = d.counters();
               l = d.live_stats();  // completes a deferred ingest first
             }
             nb::dict out;
             out["proposals"] = c.proposals;
             out["drafts"] = c.drafts;
             out["draft_tokens"] = c.draft_tokens;
             out["requests"] = c.requests;
             out["verified_drafts"] = c.verified_drafts;
             out["accepted_tokens"] = c.accepted_tokens;
             nb::list wins;
             for (auto w : c.wins) wins.append(w);
             out["wins"] = wins;
             out["calibration_tokens"] = d.calibration_tokens();
             out["deferred_steps"] = g.deferred_steps;
             out["caller_ingests"] = g.caller_ingests;
             out["ingest_waits"] = g.waits;
             out["ingest_background_seconds"] = g.background_seconds;
             out["ingest_last_seconds"] = g.last_seconds;
             out["ingest_background_cpu_seconds"] = g.background_cpu_seconds;
             out["ingest_thread_cpu_seconds"] = g.thread_cpu_seconds;
             out["ingest_wakeups"] = g.wakeups;
             out["ingest_queued_tokens"] = g.queued_tokens;
             out["active_requests"] = l.active_requests;
             out["sibling_groups"] = l.sibling_groups;
             out["lingering_finished"] = l.lingering_finished;
             out["live_running_tokens"] = l.running_tokens;
             out["live_finished_tokens"] = l.finished_tokens;
             out["live_local_tokens"] = l.local_tokens;
             out["live_bytes"] = l.bytes;
             out["live_rebuilds"] = l.rebuilds;
             out["live_evicted_outputs"] = l.evicted;
             out["live_evicted_tokens"] = l.evicted_tokens;
             out["live_group_tokens"] = l.group_tokens;
             out["live_group_appends"] = l.group_appends;
             out["live_group_chain_steps"] = l.group_chain_steps;
             out["live_local_appends"] = l.local_appends;
             out["live_local_chain_steps"] = l.local_chain_steps;
             auto h = d.history().stats();
             out["index_problems"] = h.problems;
             out["index_tokens"] = h.tokens;
             out["index_sequences"] = h.sequences;
             out["index_states"] = h.states;
             out["index_bytes"] = h.bytes;
             out["global_tokens"] = h.global_tokens;
             out["global_bytes"] = h.global_bytes;
             out["pending_updates"] = h.pending;
             out["update_builds"] = h.builds;
             out["update_errors"] = h.errors;
             out["update_seconds"] = h.build_seconds;
             return out;
           })
      .def("acceptance_totals",
           [](das::Drafter& d) {
             auto c = d.counters();
             return nb::make_tuple(c.verified_drafts, c.verified_tokens, c.accepted_tokens);
           })
      .def("calibration_ratio", &das::Drafter::calibration_ratio, "source"_a, "bucket"_a, "position"_a, "bin"_a)
      .def("check", &das::Drafter::check, nb::call_guard<nb::gil_scoped_release>());

  m.def("selftest_containers", &das::selftest_containers, "seed"_a, "n"_a, nb::call_guard<nb::gil_scoped_release>(),
        "Self-check of the hash table and the growing array of the automata against the standard library (tests).");
  m.def(
      "selftest_snapshot_layout",
      [](uint64_t seed, int64_t n) {
        double share = 0.0;
        std::string err = das::selftest_snapshot_layout(seed, n, share);
        return nb::make_tuple(err, share);
      },
      "seed"_a, "n"_a, "Self-check of a history snapshot's chain layout (tests): (error or '', sequential share).");

  m.def(
      "controller_budgets",
      [](nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu> accept,
         nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu> table, In1<double> pooled,
         In1<double> generated, In1<double> cap, In1<double> tau_obs,
         nb::ndarray<const double, nb::ndim<3>, nb::c_contig, nb::device::cpu> draws, const nb::dict& params,
         Out1<int32_t> lengths, Out1<double> value, Out1<double> p, Out1<double> expected_kept,
         Out1<double> rem_mean) {
        const size_t n = accept.shape(0);
        for (auto [name, got] : {std::pair<const char*, size_t>{"table", table.shape(0)},
                                 {"generated", generated.shape(0)}, {"cap", cap.shape(0)},
                                 {"tau_obs", tau_obs.shape(0)},
                                 {"lengths", lengths.shape(0)}, {"value", value.shape(0)}, {"p", p.shape(0)},
                                 {"expected_kept", expected_kept.shape(0)}, {"rem_mean", rem_mean.shape(0)}})
          need_rows(name, got, n);
        check_samples(n, table.shape(1), draws.shape(0), draws.shape(1), draws.shape(2));
        const das::ControllerParams prm = controller_params(params);
        nb::gil_scoped_release nogil;
        return das::controller_budgets(
            static_cast<int64_t>(n), static_cast<int64_t>(accept.shape(1)), accept.data(),
            static_cast<int64_t>(table.shape(1)), table.data(), static_cast<int64_t>(pooled.shape(0)), pooled.data(),
            generated.data(), cap.data(), tau_obs.data(), static_cast<int64_t>(draws.shape(2)), draws.data(),
            static_cast<int64_t>(draws.shape(1)), prm, lengths.data(), value.data(), p.data(), expected_kept.data(), rem_mean.data());
      },
      "accept"_a, "table"_a, "pooled"_a, "generated"_a, "cap"_a, "tau_obs"_a, "draws"_a, "params"_a,
      "lengths"_a.noconvert(),
      "value"_a.noconvert(), "p"_a.noconvert(), "expected_kept"_a.noconvert(), "rem_mean"_a.noconvert(),
      "Per-row draft budgets of one engine step (das_trl/budget/controller.py, BudgetController.budgets); see "
      "src/controller.h for shapes. Returns the expected makespan in rounds.");

  m.def(
      "controller_cut",
      [](nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu> accept,
         nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu> table, In1<double> pooled,
         In1<int64_t> rows, In1<double> generated, In1<double> cap,
         nb::ndarray<const double, nb::ndim<3>, nb::c_contig, nb::device::cpu> draws, In1<double> weight,
         const nb::dict& params, Out1<int32_t> lengths, Out1<double> value, Out1<double> expected_kept) {
        const size_t m = accept.shape(0), n = generated.shape(0);
        for (auto [name, got] : {std::pair<const char*, size_t>{"table", table.shape(0)}, {"rows", rows.shape(0)},
                                 {"lengths", lengths.shape(0)}, {"value", value.shape(0)},
                                 {"expected_kept", expected_kept.shape(0)}})
          need_rows_like(name, got, "accept", m);
        need_rows_like("weight", weight.shape(0), "generated", n);
        if (cap.shape(0)) need_rows_like("cap", cap.shape(0), "generated", n);
        for (size_t i = 0; i < m; ++i)
          if (rows.data()[i] < 0 || static_cast<size_t>(rows.data()[i]) >= n)
            throw das::InputError("controller_cut: row " + std::to_string(rows.data()[i]) + " outside the plan's " +
                                  std::to_string(n) + " rows");
        check_samples(m, table.shape(1), draws.shape(0), draws.shape(1), draws.shape(2));
        const das::ControllerParams prm = controller_params(params);
        das::CutResult r;
        {
          nb::gil_scoped_release nogil;
          r = das::controller_cut(static_cast<int64_t>(m), static_cast<int64_t>(accept.shape(1)), accept.data(),
                                  static_cast<int64_t>(table.shape(1)), table.data(),
                                  static_cast<int64_t>(pooled.shape(0)), pooled.data(), rows.data(), generated.data(),
                                  cap.shape(0) ? cap.data() : nullptr, static_cast<int64_t>(draws.shape(2)),
                                  draws.data(), static_cast<int64_t>(draws.shape(1)), weight.data(), prm,
                                  lengths.data(), value.data(), expected_kept.data());
        }
        return nb::make_tuple(r.kept_tokens, r.rows_drafting, r.offered, r.expected);
      },
      "accept"_a, "table"_a, "pooled"_a, "rows"_a, "generated"_a, "cap"_a, "draws"_a, "weight"_a, "params"_a,
      "lengths"_a.noconvert(), "value"_a.noconvert(), "expected_kept"_a.noconvert(),
      "The cut of a planned step for its drafted rows (das_trl/budget/controller.py, BudgetController.cut): kept "
      "draft tokens per row given each row's weight c_base * P_i; see src/controller.h. Returns (kept tokens, rows "
      "keeping a token, offered tokens, expected accepted tokens).");

  m.def(
      "controller_rows_seen",
      [](In1<int64_t> slots, In1<int64_t> slot_epoch, int64_t epoch) {
        return das::controller_rows_seen(static_cast<int64_t>(slots.shape(0)), slots.data(),
                                         static_cast<int64_t>(slot_epoch.shape(0)), slot_epoch.data(), epoch);
      },
      "slots"_a, "slot_epoch"_a, "epoch"_a,
      "Whether every slot is in [0, len(slot_epoch)) with slot_epoch[slot] >= epoch (BudgetController.quiet_step).");

  m.def("controller_scratch_bytes", &das::controller_scratch_bytes,
        "Bytes of the controller kernels' scratch arrays, all threads together (kept per calling thread, sized by the "
        "largest batch it planned).");

  m.def(
      "controller_plan",
      [](In1<double> out_len, In1<double> rounds, In1<double> max_output, In1<int32_t> caps, In1<double> q,
         bool replan, nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu> table, In1<double> pooled,
         nb::ndarray<const double, nb::ndim<3>, nb::c_contig, nb::device::cpu> draws, In1<int64_t> slots,
         Out1<double> slot_p, Out1<int64_t> slot_epoch, int64_t epoch, In1<double> tau_z, In1<double> send,
         const nb::dict& params, Out1<bool> draft, Out1<double> weight, Out1<double> p, Out1<double> rem_mean,
         Out1<int32_t> budget) {
        const size_t n = out_len.shape(0);
        for (auto [name, got] : {std::pair<const char*, size_t>{"caps", caps.shape(0)}, {"q", q.shape(0)},
                                 {"draft", draft.shape(0)}, {"weight", weight.shape(0)}, {"p", p.shape(0)},
                                 {"rem_mean", rem_mean.shape(0)}, {"budget", budget.shape(0)}})
          need_rows_like(name, got, "out_len", n);
        // rounds / max_output / slots: n rows, or none (0 rows)
        for (auto [name, got] : {std::pair<const char*, size_t>{"rounds", rounds.shape(0)},
                                 {"max_output", max_output.shape(0)}, {"slots", slots.shape(0)},
                                 {"send", send.shape(0)}})
          if (got) need_rows_like(name, got, "out_len", n);
        for (size_t i = 0; i < n; ++i) {  // NaN fails every comparison
          if (!(out_len.data()[i] >= 0.0) || (max_output.shape(0) && !(max_output.data()[i] >= 0.0)) ||
              (rounds.shape(0) && !(rounds.data()[i] >= 0.0)))
            throw das::InputError("controller_plan: row " + std::to_string(i) + " has out_len " +
                                  std::to_string(out_len.data()[i]) + (max_output.shape(0) ? ", max_output " +
                                  std::to_string(max_output.data()[i]) : std::string()) +
                                  (rounds.shape(0) ? ", rounds " + std::to_string(rounds.data()[i]) : std::string()) +
                                  " (need numbers >= 0)");
          // a NaN acceptance was never drafted, one above 1 counted as 0.999: both are the caller's bug
          if (!(q.data()[i] >= 0.0 && q.data()[i] <= 1.0) ||
              (send.shape(0) && !(send.data()[i] >= 0.0 && send.data()[i] <= 1.0)))
            throw das::InputError("controller_plan: row " + std::to_string(i) + " has q " +
                                  std::to_string(q.data()[i]) + (send.shape(0) ? ", send " +
                                  std::to_string(send.data()[i]) : std::string()) + " (need [0, 1])");
        }
        const bool has_slots = slots.shape(0) > 0;
        if (n && !has_slots && !replan) throw das::InputError("controller_plan: without slots every step must replan");
        if (slot_epoch.shape(0) != slot_p.shape(0))
          throw das::InputError("controller_plan: slot_p and slot_epoch must have the same length");
        const int64_t n_slots = static_cast<int64_t>(slot_p.shape(0));
        for (size_t i = 0; i < slots.shape(0); ++i)
          if (slots.data()[i] < 0 || slots.data()[i] >= n_slots)
            throw das::InputError("controller_plan: slot " + std::to_string(slots.data()[i]) + " outside [0, " +
                                  std::to_string(n_slots) + ")");
        if (replan) {
          need_rows("table", table.shape(0), n);
          check_samples(n, table.shape(1), draws.shape(0), draws.shape(1), draws.shape(2));
          if (tau_z.shape(0) && tau_z.shape(0) != draws.shape(2))
            throw das::InputError("controller_plan: tau_z has " + std::to_string(tau_z.shape(0)) +
                                  " entries but draws has " + std::to_string(draws.shape(2)) + " samples");
        }
        const das::ControllerParams prm = controller_params(params);
        das::PlanResult r;
        {
          nb::gil_scoped_release nogil;
          r = das::controller_plan(
              static_cast<int64_t>(n), out_len.data(), rounds.shape(0) ? rounds.data() : nullptr,
              max_output.shape(0) ? max_output.data() : nullptr, caps.data(), q.data(), replan,
              static_cast<int64_t>(table.shape(1)), table.data(), static_cast<int64_t>(pooled.shape(0)),
              pooled.data(), static_cast<int64_t>(draws.shape(2)), draws.data(), static_cast<int64_t>(draws.shape(1)),
              has_slots ? slots.data() : nullptr, slot_p.data(), slot_epoch.data(), epoch,
              tau_z.shape(0) ? tau_z.data() : nullptr, send.shape(0) ? send.data() : nullptr, prm,
              reinterpret_cast<uint8_t*>(draft.data()), weight.data(), p.data(), rem_mean.data(), budget.data());
        }
        return nb::make_tuple(r.makespan, r.drafted, r.tail_rows);
      },
      "out_len"_a, "rounds"_a, "max_output"_a, "caps"_a, "q"_a, "replan"_a, "table"_a, "pooled"_a, "draws"_a,
      "slots"_a, "slot_p"_a.noconvert(), "slot_epoch"_a.noconvert(), "epoch"_a, "tau_z"_a, "send"_a, "params"_a,
      "draft"_a.noconvert(),
      "weight"_a.noconvert(), "p"_a.noconvert(), "rem_mean"_a.noconvert(), "budget"_a.noconvert(),
      "BudgetController.plan after its replan decision (das_trl/budget/controller.py): tail probabilities (recomputed "
      "or renormalised from slot_p), the prior shrink, weights and the gate, in one call; see src/controller.h. "
      "Returns (expected makespan in rounds or nan, rows drafted, rows with P >= 0.5).");

  nb::class_<das::RequestBook>(m, "RequestBook",
                               "Per-request records and the step bookkeeping of das_trl/vllm/speculator.py "
                               "(see src/request_book.h; the Python reference is das_trl/vllm/request_book.py).")
      .def(nb::init<>())
      .def("set_prior", &das::RequestBook::set_prior, "prior"_a, "prior_rounds"_a, "send_rounds"_a = 0.0)
      .def("reset", &das::RequestBook::reset, "slot"_a, "key"_a, "max_output"_a, "dslot"_a)
      .def("begin", [](das::RequestBook& b, In1<int64_t> slots, int64_t steps) {
             return b.begin(slots.data(), static_cast<int64_t>(slots.shape(0)), steps);
           }, "slots"_a, "steps"_a = 1)
      .def("distinct", [](das::RequestBook& b, In1<int64_t> slots) {
             return b.distinct(slots.data(), static_cast<int64_t>(slots.shape(0)));
           }, "slots"_a)
      .def("decay", &das::RequestBook::decay, "steps"_a = 1)
      .def("prepare",
           [](das::RequestBook& b, In1<int64_t> slots, In1<int32_t> num_sampled, In1<int32_t> verified,
              In1<int32_t> num_tokens, In1<int32_t> num_prompt, int64_t max_model_len, int32_t k, Out1<int64_t> key,
              Out1<int32_t> out_len, Out1<int64_t> rounds, Out1<int64_t> max_output, Out1<int32_t> caps,
              Out1<double> q, Out1<double> send) {
             const size_t n = slots.shape(0);
             for (auto [name, got] : {std::pair<const char*, size_t>{"num_sampled", num_sampled.shape(0)},
                                      {"verified", verified.shape(0)}, {"num_tokens", num_tokens.shape(0)},
                                      {"num_prompt", num_prompt.shape(0)}, {"key", key.shape(0)},
                                      {"out_len", out_len.shape(0)}, {"rounds", rounds.shape(0)},
                                      {"max_output", max_output.shape(0)}, {"caps", caps.shape(0)},
                                      {"q", q.shape(0)}, {"send", send.shape(0)}})
               need_rows(name, got, n);
             const das::RequestBook::Observed o = b.prepare(
                 slots.data(), static_cast<int64_t>(n), num_sampled.data(), verified.data(), num_tokens.data(),
                 num_prompt.data(), max_model_len, k, key.data(), out_len.data(), rounds.data(), max_output.data(),
                 caps.data(), q.data(), send.data());
             return nb::make_tuple(o.verified_drafts, o.accepted, o.checked, o.expected);
           },
           "slots"_a, "num_sampled"_a, "verified"_a, "num_tokens"_a, "num_prompt"_a, "max_model_len"_a, "k"_a,
           "key"_a.noconvert(), "out_len"_a.noconvert(), "rounds"_a.noconvert(), "max_output"_a.noconvert(),
           "caps"_a.noconvert(), "q"_a.noconvert(), "send"_a.noconvert(),
           "Last step's verification, then the plan's inputs (written to the output arrays). Returns (verified "
           "drafts, accepted tokens, verified tokens, expected accepted tokens).")
      .def("finish",
           [](das::RequestBook& b, In1<int64_t> slots, In1<bool> planned, In1<int64_t> drafting, In1<int32_t> kept,
              In1<double> expected_kept, Out2<int32_t> tokens, Out2<double> accept, Out1<int32_t> lengths,
              Out1<int8_t> source, Out1<int32_t> match_len, das::Drafter* drafter) {
             const size_t n = slots.shape(0), m = drafting.shape(0);
             for (auto [name, got] : {std::pair<const char*, size_t>{"planned", planned.shape(0)},
                                      {"tokens", tokens.shape(0)}, {"accept", accept.shape(0)},
                                      {"lengths", lengths.shape(0)}, {"source", source.shape(0)},
                                      {"match_len", match_len.shape(0)}})
               need_rows(name, got, n);
             need_rows("kept", kept.shape(0), m);
             need_rows("expected_kept", expected_kept.shape(0), m);
             if (accept.shape(1) != tokens.shape(1))
               throw das::InputError("tokens and accept must have the same width");
             nb::gil_scoped_release nogil;  // the drafter's trim takes its lock
             const das::RequestBook::Finished f = slot_guard([&] {
               return b.finish(slots.data(), static_cast<int64_t>(n), planned.data(), drafting.data(),
                               static_cast<int64_t>(m), kept.data(), expected_kept.data(), tokens.data(),
                               accept.data(), lengths.data(), source.data(), match_len.data(),
                               static_cast<int32_t>(tokens.shape(1)), drafter);
             });
             nb::gil_scoped_acquire gil;
             return nb::make_tuple(f.drafts, f.draft_tokens);
           },
           "slots"_a, "planned"_a, "drafting"_a, "kept"_a, "expected_kept"_a, "tokens"_a.noconvert(),
           "accept"_a.noconvert(), "lengths"_a.noconvert(),
           "source"_a.noconvert(), "match_len"_a.noconvert(), "drafter"_a.none(),
           "After the drafter's step and the cut: records, the output cut in place and the drafter's trim. Returns "
           "(drafts, draft tokens) sent.")
      .def("ints", &das::RequestBook::ints, "which"_a)
      .def("doubles", &das::RequestBook::doubles, "which"_a)
      .def("bytes", &das::RequestBook::bytes)
      .def("size", &das::RequestBook::size)
      .def_rw("global_hits", &das::RequestBook::global_hits)
      .def_rw("global_misses", &das::RequestBook::global_misses)
      .def_rw("global_speculated", &das::RequestBook::global_speculated)
      .def_rw("global_sent_steps", &das::RequestBook::global_sent_steps);
}

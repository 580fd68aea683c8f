"""NativeDASDrafter: the DAS drafter, with its per-round work in the C++ core (``das_trl/drafter/native``).

This is the drafter the product runs (``DrafterConfig.backend`` "auto" or "native"). It has the public interface and
semantics of the pure-Python reference :class:`~das_trl.drafter.reference.DASDrafter` (``reference/``, which the
equivalence tests compare it with draft for draft) and imports nothing from it; what the speed needs on top:

* **One call per engine step.** :meth:`propose_batch` drafts every row in one native call that releases the GIL,
  into preallocated arrays.
* **Match state kept per request.** Each request's position in its problem's and the global history automaton is
  advanced by the tokens it gained, not re-matched from the context every round; the live sources (own text,
  running siblings, running batch) are suffix automata the request's own tokens extend.
* **History builds off the interpreter.** A push updates the window bookkeeping (``RolloutHistory``, Python, cheap),
  then hands copies of the changed problems' sequences to native builder threads; requests keep drafting from the
  previous snapshots until the new ones are swapped in.
* **Steps that draft nothing are nearly free.** A row with budget <= 0 gets "no draft" and no drafting work; in a step
  where no row drafts, the new tokens are copied and appended to the automata by a native thread while the engine
  runs its forward pass (``DrafterConfig.background_ingest``; every call that needs the automata completes that work
  first, so drafts do not change); in a drafting step, so are the idle rows' (``DrafterConfig.defer_idle_rows``: the
  shared automata see them a step later). :meth:`step_slots` takes slots (:meth:`slot_of`) instead of request ids.

Documented differences to the reference: ties between equally frequent continuations go to the smallest token id
(arctic takes whichever its hash map yields first; the reference matches with ``tree_factory=ReferenceSuffixTree``);
history support counts are exact (the reference's count-min table can over-count on hash collisions); ``propose``
drafts from the request's own prompt + extended tokens and ignores ``context``.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Sequence

import numpy as np

from . import native as _native
from .config import DrafterConfig
from .draft_batch import DraftBatch
from .history import RolloutHistory, history_state
from .problem_key import problem_key as _problem_key
from .sources import MATCH_BUCKETS, POSITION_BUCKETS, SOURCE_ORDER
from .tokens import (_INT32, TOKEN_LIMIT, as_tokens, check_request_id, count_array, group_rollouts,
                     int32_array, token_view)

_GLOBAL_KEY = 2**64 - 1  # HistoryIndex::kGlobalKey
_I32_MAX = 2**31 - 1


class NativeDASDrafter:
    """DAS drafter backed by the native core. See the module docstring; each method's contract is the reference's
    (:class:`~das_trl.drafter.reference.DASDrafter`).

    Args:
        config: :class:`DrafterConfig` (defaults if ``None``); ``builder_threads`` native threads build history.

    Raises:
        ImportError: the native core is not built (the message says how to build it).
        ValueError: a config the native core cannot hold (e.g. ``max_spec_tokens`` > 64).

    Thread-safety: every method may be called from any thread; the native core has its own lock and releases the GIL
    while drafting and while waiting for history builds.
    """

    def __init__(self, config: DrafterConfig | None = None) -> None:
        self.config = config if config is not None else DrafterConfig()
        self._mod = _native.load()
        self._checked_out: tuple | None = None  # the out arrays step_slots last validated (reused views)
        self._held_out: tuple | None = None  # (batch, its StepOutputs): the pre-checked step's output, converted once
        c = self.config
        self._core = self._mod.Drafter({
            "max_tree_depth": c.max_tree_depth, "match_context_tokens": c.match_context_tokens,
            "max_spec_tokens": c.max_spec_tokens, "max_spec_factor": float(c.max_spec_factor),
            "max_spec_offset": float(c.max_spec_offset), "min_token_prob": float(c.min_token_prob),
            "min_match_len": c.min_match_len, "use_problem_tree": c.use_problem_tree,
            "use_global_tree": c.use_global_tree, "use_local_tree": c.use_local_tree,
            "share_running_siblings": c.share_running_siblings, "share_running_batch": c.share_running_batch,
            "prompt_tail_tokens": c.prompt_tail_tokens,
            "live_token_budget": int(getattr(c, "live_token_budget", 2_000_000)), "support_ngram": c.support_ngram,
            "evidence_pseudocount": float(c.evidence_pseudocount),
            "match_len_pseudocount": float(c.match_len_pseudocount),
            "truncate_by_evidence": c.truncate_by_evidence, "calibrate_acceptance": c.calibrate_acceptance,
            "calibration_pseudocount": float(c.calibration_pseudocount),
            "calibration_step_decay": float(c.calibration_step_decay),
            "builder_threads": int(getattr(c, "builder_threads", 1)),
            "draft_threads": int(getattr(c, "draft_threads", 1)),
            "background_ingest": bool(getattr(c, "background_ingest", True)),
            "defer_idle_rows": bool(getattr(c, "defer_idle_rows", True)),
            "defer_shared_ingest": bool(getattr(c, "defer_shared_ingest", False)),
        })
        self._lock = threading.RLock()
        self._clear_python()

    def _clear_python(self) -> None:
        self._history = RolloutHistory(self.config.window, self.config.history_token_budget)
        self._slots: dict[str, int] = {}
        self._free: list[int] = []
        self._requests_started = 0

    # ------------------------------------------------------------------ history
    def add_rollouts(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                     problem_keys: Sequence[int] | None = None, *, background: bool = False) -> dict:
        """Push one GRPO step's rollouts (see :meth:`DASDrafter.add_rollouts`). The changed problems' automata and
        the global one are rebuilt on native threads; ``background=False`` waits for them.

        Raises:
            ValueError: bad input (nothing is changed).
        """
        groups, summary = group_rollouts(prompts, completions, problem_keys)
        tail_n = self.config.prompt_tail_tokens
        with self._lock:
            changed: set[int] = set()
            pushed: list[int] = []
            for key, (prompt, comps) in groups.items():
                if not comps:
                    continue
                evicted = self._history.add(key, comps, prompt[-tail_n:] if tail_n else prompt[:0])
                pushed.append(key)
                changed.add(key)
                changed.update(k for k, _ in evicted)
                summary["evicted"] = summary.get("evicted", 0) + len(evicted)
            summary.setdefault("evicted", 0)
            if pushed:
                self._core.release_finished(pushed)
                self._core.new_step()  # one push = one training step: older acceptance evidence weighs less
            if self.config.use_problem_tree:
                for key in changed:
                    self._submit_problem(key)
            if self.config.use_global_tree and changed:
                self._submit_global()
        if background:
            summary["queued"] = True
        else:
            self._core.wait_history(-1.0)
        return summary

    def _pack(self, seqs: list[np.ndarray], weights: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        tokens = np.concatenate(seqs).astype(np.int32, copy=False) if seqs else np.zeros(0, np.int32)
        return tokens, offsets, np.asarray(weights, dtype=np.int32)

    def _submit_problem(self, key: int) -> None:
        apps = list(self._history.appearances(key))
        if not apps:
            self._core.drop_history(key)
            return
        seqs, weights = [], []
        w_new = self.config.recent_appearance_weight
        for i, app in enumerate(apps):
            w = w_new if i == len(apps) - 1 else 1
            for comp in app.completions:
                seqs.append(np.concatenate([app.prompt_tail, comp]))
                weights.append(w)
        self._core.submit_history(key, *self._pack(seqs, weights))

    def _submit_global(self) -> None:
        k = self.config.global_samples_per_appearance
        seqs = []
        for app in self._history.appearances():
            comps = app.completions if k == 0 else app.completions[:k]
            seqs.extend(np.concatenate([app.prompt_tail, c]) for c in comps)
        if not seqs:
            self._core.drop_history(_GLOBAL_KEY)
            return
        self._core.submit_history(_GLOBAL_KEY, *self._pack(seqs, [1] * len(seqs)))

    def wait_for_ingest(self) -> None:
        """Append the tokens of a step that deferred its ingest (``background_ingest``) now, waiting for the ingest
        thread if it is at work. Only benchmarks and tests need this: every method that reads the automata does it
        itself."""
        self._core.flush()

    def wait_for_updates(self, timeout: float | None = None) -> bool:
        """Block until every queued history build is applied (``timeout`` seconds at most; ``None``: no limit).
        Returns True when nothing is pending."""
        return bool(self._core.wait_history(-1.0 if timeout is None else float(timeout)))

    # ------------------------------------------------------------------ requests
    def start_request(self, request_id: str, prompt_token_ids: Sequence[int] | np.ndarray,
                      problem_key: int | None = None) -> None:
        """Begin drafting for a request. Raises ``ValueError`` (already active, an id that is not a str or an int,
        bad token ids or key)."""
        self.start_slot(request_id, prompt_token_ids, problem_key)

    def start_slot(self, request_id: str, prompt_token_ids: Sequence[int] | np.ndarray,
                   problem_key: int | None = None) -> tuple[int, int]:
        """:meth:`start_request`, returning the request's ``(slot, problem key)`` (what :meth:`slot_of` and
        :meth:`problem_of` return, without their two locked lookups). Raises as :meth:`start_request`."""
        check_request_id(request_id)
        prompt = token_view(prompt_token_ids, "prompt_token_ids")  # the core copies it (no copy here)
        key = _problem_key(prompt) if problem_key is None else int(problem_key)
        if not 0 <= key < 2**63:
            raise ValueError(f"problem_key must be an int in [0, 2**63), got {problem_key!r}")
        with self._lock:
            if request_id in self._slots:
                raise ValueError(f"request {request_id!r} is already active")
            # Every slot handed out is active or free (stop_request frees it once; reset clears both), so a freed slot
            # or the next new one is never in use (no scan of the active slots: 5 us at 300 requests).
            slot = self._free.pop() if self._free else len(self._slots) + len(self._free)
            self._core.start(slot, prompt, key)
            self._slots[request_id] = slot
            self._requests_started += 1
        return slot, key

    def _slot(self, request_id: str) -> int:
        slot = self._slots.get(request_id)
        if slot is None:
            raise KeyError(f"request {request_id!r} is not active (call start_request first)")
        return slot

    def slot_of(self, request_id: str) -> int:
        """The native slot of an active request, for :meth:`step_slots`. It stays the request's until
        :meth:`stop_request` (or :meth:`reset`); then it may be given to the next request started.

        Raises:
            KeyError: the request is not active.
        """
        with self._lock:
            return self._slot(request_id)

    def extend_request(self, request_id: str, new_token_ids: Sequence[int] | np.ndarray) -> None:
        """Append tokens to a request's output. Raises ``KeyError`` (unknown) or ``ValueError`` (bad ids)."""
        tokens = as_tokens(new_token_ids, "new_token_ids")
        with self._lock:
            self._core.extend(self._slot(request_id), tokens)

    def stop_request(self, request_id: str) -> None:
        """End a request (its output lingers for siblings). Raises ``KeyError`` if unknown."""
        with self._lock:
            slot = self._slot(request_id)
            self._core.stop(slot)
            del self._slots[request_id]
            self._free.append(slot)

    def problem_of(self, request_id: str) -> int:
        """Problem key of an active request. Raises ``KeyError`` if it is not active."""
        with self._lock:
            return int(self._core.problem_of(self._slot(request_id)))

    def history_problems(self) -> list[int]:
        """Keys of the problems with history (a new list)."""
        with self._lock:
            return self._history.problems()

    def history_lengths(self, problem_key: int) -> np.ndarray:
        """Completion lengths (``np.int64``, oldest first) in a problem's window; empty if unknown."""
        with self._lock:
            return self._history.lengths(problem_key)

    @property
    def active_requests(self) -> set[str]:
        """Ids of requests started and not stopped (a new set)."""
        with self._lock:
            return set(self._slots)

    # ------------------------------------------------------------------ drafting
    def propose(self, request_id: str, context: np.ndarray | Sequence[int] | None, max_tokens: int) -> list[int]:
        """Draft the next tokens of one request (``context`` is ignored: the request's own text is used).

        Raises:
            KeyError: unknown request. ValueError: ``max_tokens`` is not an int.
        """
        return self.propose_batch([request_id], [max_tokens]).row(0)

    def propose_batch(self, request_ids: Sequence[str], max_tokens: Sequence[int] | np.ndarray,
                      contexts: Sequence | None = None) -> DraftBatch:
        """Drafts of many requests in one native call (see :meth:`DASDrafter.propose_batch`; ``contexts`` ignored).

        Raises:
            KeyError: an unknown request (no row was drafted). ValueError: length mismatch, budgets that are not
            ints (strings, 2.7), or a request listed twice (no row was drafted).
        """
        n = len(request_ids)
        budgets = count_array(max_tokens, "max_tokens", low=-TOKEN_LIMIT)
        if len(budgets) != n:
            raise ValueError(f"propose_batch: {n} request_ids but {len(budgets)} max_tokens")
        out = DraftBatch.empty(n, self.config.max_spec_tokens)
        with self._lock:
            slots = np.fromiter((self._slot(r) for r in request_ids), dtype=np.int32, count=n)
        self._core.propose(slots, np.clip(budgets, -1, _I32_MAX).astype(np.int32), out.tokens, out.accept,
                           out.lengths, out.source, out.match_len, False)  # zeroed: rows without a draft not written
        return out

    def step(self, request_ids: Sequence[str], token_matrix: np.ndarray, rows: np.ndarray, num_tokens: np.ndarray,
             num_prompt: np.ndarray, num_sampled: np.ndarray, num_verified: np.ndarray,
             max_tokens: np.ndarray, out: DraftBatch | None = None) -> DraftBatch:
        """One engine step in one native call (see :meth:`DASDrafter.step`), with request ids: maps them to slots
        (:meth:`slot_of`; a dict lookup per row) and calls :meth:`step_slots`, whose arguments and costs it has.

        Raises:
            KeyError: an unknown request (nothing changed). ValueError: as :meth:`step_slots`.
        """
        with self._lock:
            try:
                slots = np.array([self._slots[r] for r in request_ids], dtype=np.int32)
            except KeyError:
                for r in request_ids:
                    self._slot(r)  # raises with the message
                raise
        return self.step_slots(slots, token_matrix, rows, num_tokens, num_prompt, num_sampled, num_verified,
                               max_tokens, out)

    def step_slots(self, slots: np.ndarray, token_matrix: np.ndarray, rows: np.ndarray, num_tokens: np.ndarray,
                   num_prompt: np.ndarray, num_sampled: np.ndarray, num_verified: np.ndarray,
                   max_tokens: np.ndarray, out: DraftBatch | None = None, release: bool = True, *,
                   _prechecked: bool = False) -> DraftBatch:
        """One engine step for ``n`` rows given by slot (:meth:`slot_of`), in one native call that releases the GIL:
        each row's verification report, its new tokens read in place from ``token_matrix``, then drafts.

        Row ``i`` is the request in ``slots[i]``; its text is ``token_matrix[rows[i], :num_tokens[i]]``, of which
        the first ``num_prompt[i]`` tokens are the prompt, and it gained ``num_sampled[i]`` tokens this step. The
        verification of its previous draft is recorded as ``accepted = min(verified, num_sampled[i] - 1)`` with
        ``verified`` its draft length, capped by ``num_verified[i]`` when ``>= 0``. A row whose output is shorter
        than the drafter has seen (preemption) or whose prompt length changed starts over from its prompt.

        Cost: a row with ``max_tokens[i] <= 0`` gets "no draft" (length 0, source -1, match length 0) and no drafting
        work. When no row drafts and ``config.background_ingest`` is on, the new tokens are queued (behind what
        earlier steps queued, without waiting for it) and appended to the automata by the ingest thread while the
        engine runs its forward pass: the call costs the validation, the reports and that copy. In a drafting step
        everything queued is completed first, then the drafting rows' new tokens are appended before the drafts are
        made, and with ``config.defer_idle_rows`` the other rows' are left to the thread (the shared automata see
        them one step later; with ``config.defer_shared_ingest`` so does the batch automaton the drafting rows'
        own); without it every row's are appended first, and drafts equal the synchronous path's.

        Args:
            slots: ``int32 [n]`` active slots.
            token_matrix: ``int32 [R, L]`` (vLLM's ``token_ids_cpu``), C-contiguous; other layouts and dtypes are
                copied. Read during the call only.
            rows, num_tokens, num_prompt, num_sampled, num_verified: ``int [n]`` (``int32`` arrays are used without
                a copy; other integer arrays are converted).
            max_tokens: ``int [n]`` draft budget per row (capped at ``config.max_spec_tokens``; ``<= 0``: none).
            out: a :class:`DraftBatch` of exactly ``n`` rows and ``config.max_spec_tokens`` columns to fill (its five
                arrays C-contiguous, writable, of :class:`DraftBatch` dtypes), e.g. views of buffers kept across
                steps; every row is written (rows without a draft zeroed). ``None``: a new zeroed batch.
            release: offer the deferred tokens to the ingest thread now; ``False``: only at :meth:`release_ingest`
                (call it after the step's :meth:`trim`, which then never waits for that ingest; a call that needs
                the automata completes them anyway).
            _prechecked: private to the Speculator, which validated this step's arrays already (``slots``, the row
                arrays and ``max_tokens`` C-contiguous ``int32 [n]``, ``out`` its own batch of ``n`` rows, reused
                while the batch size holds and its arrays never replaced): skip validating them again (~10 us per
                engine step), and hand ``out``'s arrays to the core once per batch object (``StepOutputs``). The native call still checks every length and
                ``out``'s width (ValueError, nothing changed); ``token_matrix`` is checked as without it.

        Returns:
            ``out`` (or the new batch).

        Raises:
            KeyError: a slot that is not active. ValueError: lengths or shapes out of range, a slot listed twice,
            or a bad ``out`` (nothing changed).
        """
        if _prechecked:  # the Speculator's own buffer: it only ever holds step outputs (each row zero past its
            # length), so rows without a draft need zeroing only over their previous draft (fill mode 2); it is the
            # same batch of views while the batch size holds, its arrays never replaced: converted once for the core
            held = self._held_out
            if held is None or held[0] is not out:
                held = self._held_out = (out, self._mod.StepOutputs(out.tokens, out.accept, out.lengths, out.source,
                                                                    out.match_len))
            self._core.step_into(_as_matrix(token_matrix), slots, rows, num_tokens, num_prompt, num_sampled,
                                 num_verified, max_tokens, held[1], 2, release)
            return out
        slots = int32_array(slots, "slots")
        n = len(slots)
        cols = [int32_array(a, name, n) for a, name in ((rows, "rows"), (num_tokens, "num_tokens"),
                                                 (num_prompt, "num_prompt"), (num_sampled, "num_sampled"),
                                                 (num_verified, "num_verified"))]
        budgets = max_tokens
        if not (type(budgets) is np.ndarray and budgets.dtype == np.int32):
            budgets = np.asarray(max_tokens).reshape(-1)
            if budgets.dtype != np.int32:
                budgets = np.clip(budgets.astype(np.int64), -1, _I32_MAX).astype(np.int32)
        budgets = int32_array(budgets, "max_tokens", n)
        matrix = _as_matrix(token_matrix)
        k = self.config.max_spec_tokens
        if out is None:
            out, fill_idle = DraftBatch.empty(n, k), False  # zeroed already: rows without a draft are not written
        else:
            arrays = (out.tokens, out.lengths, out.accept, out.source, out.match_len)
            if self._checked_out is None or any(a is not b for a, b in zip(arrays, self._checked_out)):
                _check_out(out, n, k)  # a batch of views reused across steps is checked once
                self._checked_out = arrays
            fill_idle = True
        self._core.step(matrix, slots, *cols, budgets, out.tokens, out.accept, out.lengths, out.source, out.match_len,
                        fill_idle, release)
        return out

    def release_ingest(self) -> None:
        """Offer the tokens a ``step_slots(..., release=False)`` deferred to the ingest thread."""
        self._core.release_ingest()

    def trim(self, request_ids: Sequence[str], lengths: Sequence[int] | np.ndarray) -> None:
        """Cut outstanding drafts to what was sent (see :meth:`DASDrafter.trim`). Unknown ids are ignored.

        Raises:
            ValueError: ``request_ids`` and ``lengths`` differ in length, or a length is negative or not an int.
        """
        if len(request_ids) != len(lengths):
            raise ValueError(f"trim: {len(request_ids)} request ids but {len(lengths)} lengths")
        lengths = count_array(lengths, "trim: lengths", low=0)
        with self._lock:
            pairs = [(self._slots[r], k) for r, k in zip(request_ids, lengths.tolist()) if r in self._slots]
        if pairs:
            slots, keep = zip(*pairs)
            self.trim_slots(np.asarray(slots, np.int32), np.asarray(keep, np.int64))

    def trim_slots(self, slots: np.ndarray, lengths: np.ndarray) -> None:
        """:meth:`trim` by slot (:meth:`slot_of`; no per-row id lookup): ``slots`` ``int32 [m]`` active slots,
        ``lengths`` ``int [m]`` tokens sent per row (clipped to ``[0, 2**31)``). Does not wait for a deferred ingest.

        Raises:
            KeyError: a slot that is not active. ValueError: lengths differ in size.
        """
        slots = int32_array(slots, "slots")
        lengths = np.asarray(lengths)
        if lengths.dtype != np.int32 or lengths.min(initial=0) < 0:
            lengths = np.clip(lengths.astype(np.int64), 0, 2**31 - 1).astype(np.int32)
        self._core.trim(slots, int32_array(lengths, "lengths", len(slots)))

    def record_acceptance(self, request_id: str, num_accepted: int, num_verified: int | None = None) -> None:
        """Report the verification outcome of a request's last draft (see :meth:`DASDrafter.record_acceptance`);
        unknown requests and reports without a draft outstanding are ignored."""
        with self._lock:
            slot = self._slots.get(request_id)
            if slot is None:
                return
            self._core.record_acceptance(slot, int(num_accepted), -1 if num_verified is None else int(num_verified))

    def acceptance_totals(self) -> tuple[int, int, int]:
        """``(verified drafts, verified draft tokens, accepted draft tokens)`` reported so far."""
        return tuple(self._core.acceptance_totals())

    def calibration(self) -> dict[str, list[list[list[float]]]]:
        """The ratios applied to conditional priors, source -> [match-length bucket][draft-position bucket][prior bin]
        (as the reference's ``AcceptanceCalibrator.table``); ``{}`` when calibration is off."""
        if not self.config.calibrate_acceptance:
            return {}
        bins = 10
        return {name: [[[round(self._core.calibration_ratio(i, b, p, x), 3) for x in range(bins)]
                        for p in range(len(POSITION_BUCKETS) + 1)]
                       for b in range(len(MATCH_BUCKETS) + 1)] for i, name in enumerate(SOURCE_ORDER)}

    # ------------------------------------------------------------------ bookkeeping
    def stats(self) -> dict:
        """The reference drafter's stats keys plus the native core's memory figures: ``index_bytes`` (problem
        automata), ``global_bytes``, ``live_bytes`` (own-text, sibling and batch automata, sequences and gram sets;
        also under the reference's key ``live_approx_bytes``, here measured), ``bytes_per_history_token``
        ((index + global) bytes / history tokens), the reference's ``live_*`` token figures, ``live_rebuilds`` (group
        automata rebuilt after losing members), and the deferred ingest (``background_ingest``):

        * ``speculated_rows``: rows drafted (budget > 0), the same count as ``proposals``;
        * ``deferred_steps``: steps whose ingest was left to the ingest thread;
        * ``ingest_caller_steps``: deferred ingests a caller did itself because the thread had not started them
          (on the caller's critical path);
        * ``ingest_waits``: steps that found the thread ingesting and waited for it (the thread's ingest outlasted
          the engine's forward pass: wall time on the critical path);
        * ``ingest_background_seconds`` / ``ingest_last_seconds``: the thread's ingest time (steady clock) in all /
          in its last step; ``ingest_background_cpu_seconds``: its CPU time in all (less than the steady time when
          the thread waited for a core);
        * ``ingest_queued_tokens``: tokens (and started prompts' tokens) waiting for the thread when stats was
          called (what was queued since the queue was last completed);
        * ``ingest_wakeups``: offers of queued tokens that had to wake the thread (it polls for work for a while
          after each ingest, so steps of a decoding batch wake nobody); ``ingest_thread_cpu_seconds``: the thread's
          whole CPU time, its ingests and its polling.

        The live figures are read after any deferred ingest is complete."""
        with self._lock:
            out = self._history.stats()
        s = self._core.stats()
        wins = Counter({name: int(s["wins"][i]) for i, name in enumerate(SOURCE_ORDER)})
        history_tokens = max(1, out["tokens"])
        out.update(
            problem_trees=s["index_problems"], global_seqs=None, support_table_bytes=0,
            active_requests=s["active_requests"], sibling_groups=s["sibling_groups"],
            lingering_finished=s["lingering_finished"], proposals=s["proposals"], drafts=s["drafts"],
            draft_tokens=s["draft_tokens"], requests=s["requests"], wins=dict(wins),
            verified_drafts=s["verified_drafts"], accepted_tokens=s["accepted_tokens"],
            calibration_tokens=s["calibration_tokens"], pending_updates=s["pending_updates"],
            update_errors=s["update_errors"], update_seconds=s["update_seconds"],
            index_bytes=s["index_bytes"], global_bytes=s["global_bytes"], live_bytes=s["live_bytes"],
            bytes_per_history_token=(s["index_bytes"] + s["global_bytes"]) / history_tokens if out["tokens"] else 0.0,
            live_running_tokens=s["live_running_tokens"], live_finished_tokens=s["live_finished_tokens"],
            live_token_budget=self.config.live_token_budget, live_evicted_outputs=s["live_evicted_outputs"],
            live_evicted_tokens=s["live_evicted_tokens"],
            live_tree_tokens=s["live_local_tokens"] + s["live_group_tokens"], live_approx_bytes=s["live_bytes"],
            live_rebuilds=s["live_rebuilds"], speculated_rows=s["proposals"], deferred_steps=s["deferred_steps"],
            ingest_caller_steps=s["caller_ingests"], ingest_waits=s["ingest_waits"],
            ingest_background_seconds=s["ingest_background_seconds"],
            ingest_last_seconds=s["ingest_last_seconds"],
            ingest_background_cpu_seconds=s["ingest_background_cpu_seconds"],
            ingest_queued_tokens=s["ingest_queued_tokens"], ingest_wakeups=s["ingest_wakeups"],
            ingest_thread_cpu_seconds=s["ingest_thread_cpu_seconds"],
            backend="native")
        out["global_seqs"] = out.pop("global_seqs") or 0
        return out

    def reset(self) -> None:
        """Drop history, automata, live requests and counters (config kept)."""
        with self._lock:
            self._core.clear_history()
            self._core.reset_requests()
            self._clear_python()

    def state_dict(self) -> dict:
        """``{"history": RolloutHistory.to_state(), "config": dict}`` (as the reference drafter)."""
        with self._lock:
            return {"history": self._history.to_state(), "config": self.config.to_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Replace the history with a saved one and rebuild the automata (waits for them). Live requests are kept.
        Raises ``ValueError`` on a malformed state."""
        hist = RolloutHistory.from_state(history_state(state), self.config.window, self.config.history_token_budget)
        with self._lock:
            old = set(self._history.problems())
            self._history = hist
            if self.config.use_problem_tree:
                for key in old | set(hist.problems()):
                    self._submit_problem(key)
            if self.config.use_global_tree:
                self._submit_global()
        self._core.wait_history(-1.0)

    def check(self) -> str:
        """Native structural self-check (tests): ``""`` when consistent."""
        return self._core.check()


def _as_matrix(token_matrix: np.ndarray) -> np.ndarray:
    """``token_matrix`` as a C-contiguous ``int32`` array (no copy when it is one). Raises ``ValueError`` unless
    2-D."""
    matrix = token_matrix
    if type(matrix) is np.ndarray and matrix.dtype is _INT32 and matrix.ndim == 2 and matrix.flags.c_contiguous:
        return matrix  # vLLM's token_ids_cpu, every step: attribute checks only
    if not (isinstance(matrix, np.ndarray) and matrix.dtype == np.int32 and matrix.flags.c_contiguous):
        matrix = np.ascontiguousarray(matrix, dtype=np.int32)
    if matrix.ndim != 2:
        raise ValueError(f"step: token_matrix must be 2-D, got shape {matrix.shape}")
    return matrix


def _check_out(out: DraftBatch, n: int, k: int) -> None:
    """Raise ``ValueError`` unless ``out``'s arrays are C-contiguous, writable, of DraftBatch's dtypes, ``n`` rows
    and ``k`` columns."""
    for name, dtype, shape in (("tokens", np.int32, (n, k)), ("accept", np.float64, (n, k)),
                               ("lengths", np.int32, (n,)), ("source", np.int8, (n,)), ("match_len", np.int32, (n,))):
        a = getattr(out, name)
        if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.shape == shape and a.flags.c_contiguous
                and a.flags.writeable):
            got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
            raise ValueError(f"step: out.{name} must be a writable C-contiguous {np.dtype(dtype)} array of shape "
                             f"{shape}, got {got}; pass out=None for a new batch")

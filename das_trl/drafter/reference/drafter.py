"""DASDrafter: the one object a vLLM proposer talks to.

Data flow: ``add_rollouts`` (one GRPO step) -> ``RolloutHistory`` (window + budget) ->
``HistoryIndex`` (per-problem and global suffix trees, support counts). Per request:
``start_request`` -> ``extend_request`` (each round's accepted tokens) -> ``propose``
(candidates from problem / siblings / local / global trees, evidence-weighted choice,
``arbitration.py``) -> ``stop_request``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import numpy as np

from ..config import DrafterConfig
from ..draft_batch import DraftBatch
from ..history import RolloutHistory, history_state
from ..problem_key import problem_key as _problem_key
from ..sources import SOURCE_ORDER
from ..tokens import TOKEN_LIMIT, as_tokens, check_request_id, count_array, group_rollouts
from .arbitration import choose
from .arctic import suffix_tree
from .calibration import AcceptanceCalibrator
from .live import LivePool
from .suffix_index import HistoryIndex

logger = logging.getLogger(__name__)


class DASDrafter:
    """Suffix-tree drafter over a GRPO run's own rollout history (DAS, arXiv 2511.13841).

    Args:
        config: :class:`DrafterConfig` (defaults if ``None``).
        tree_factory: suffix-tree class, called with the depth (``None``: arctic-inference's ``SuffixTree``; tests
            pass :class:`~das_trl.drafter.reference.reference_tree.ReferenceSuffixTree`, which needs no arctic).

    Raises:
        ImportError: ``tree_factory`` is ``None`` and arctic-inference is missing; the message names the
            ``reference`` extra.

    Thread-safety: every public method takes one re-entrant lock. ``add_rollouts(...,
    background=True)`` applies a step on the drafter's own updater thread in small
    pieces, releasing the lock in between, so ``propose`` (the engine's critical path)
    waits for one piece at most (stall measured by ``das_trl/bench/micro/drafter_speed.py``).
    """

    def __init__(self, config: DrafterConfig | None = None, tree_factory: Callable | None = None) -> None:
        self.config = config if config is not None else DrafterConfig()
        # Suffix-tree class: arctic-inference's SuffixTree (default), or reference_tree.ReferenceSuffixTree, whose
        # ties between equally frequent continuations go to the smallest token as in the native core (tests).
        self._tree_factory = tree_factory if tree_factory is not None else suffix_tree()
        self._lock = threading.RLock()
        self._updates_done = threading.Condition(self._lock)
        self._updater: ThreadPoolExecutor | None = None
        self._pending = 0
        self._engine_waiting = 0  # engine-path callers waiting for the lock (see _engine_lock)
        self._update_errors = 0
        self._update_seconds = 0.0
        self._clear()

    def _clear(self) -> None:
        self._history = RolloutHistory(self.config.window, self.config.history_token_budget)
        self._index = HistoryIndex(self.config, self._tree_factory)
        self._live = LivePool(self.config, self._tree_factory)
        self._proposals = 0
        self._drafts = 0
        self._draft_tokens = 0
        self._requests = 0
        self._wins: Counter[str] = Counter({s: 0 for s in SOURCE_ORDER})
        self._calibrator = (AcceptanceCalibrator(SOURCE_ORDER, pseudocount=self.config.calibration_pseudocount,
                                                 step_decay=self.config.calibration_step_decay)
                            if self.config.calibrate_acceptance else None)
        # request -> (source, match length, prior a_i) of its last draft, until verification is reported
        self._unverified: dict[str, tuple[str, int, list[float]]] = {}
        self._verified_drafts = 0
        self._verified_tokens = 0
        self._accepted_tokens = 0

    # ------------------------------------------------------------------ history
    def add_rollouts(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                     problem_keys: Sequence[int] | None = None, *, background: bool = False) -> dict:
        """Push one GRPO step's rollouts into the history and the trees.

        Args:
            prompts: prompt token ids per rollout; ``prompts[i]`` pairs with
                ``completions[i]`` (siblings repeat the same prompt).
            completions: completion token ids per rollout (empty ones are ignored).
            problem_keys: optional explicit key per rollout (int in ``[0, 2**63)``);
                defaults to :func:`problem_key` of each prompt.
            background: update the history now (cheap) and the suffix trees on the
                drafter's updater thread, then return at once. Tree work is done in
                ``HistoryIndex.chunk_tokens``-token pieces with the lock released in
                between, so concurrent ``propose`` calls wait for at most one piece, not
                the whole step (the engine's critical path). Tree updates are applied in
                push order; :meth:`wait_for_updates` blocks until they are done.

        Rollouts of the same problem in one call form one appearance. Finished sibling
        outputs of those problems, kept visible since their requests stopped, are
        released now that their completions are in the history.

        Returns:
            ``{"problems", "sequences", "tokens", "evicted"}``: problems and non-empty
            sequences added, completion tokens added, appearances evicted; plus
            ``"queued": True`` in background mode.

        Raises:
            ValueError: mismatched lengths, ids not ints in ``[0, 2**31)``, or bad
                problem keys. Nothing is changed then.
        """
        groups, summary = group_rollouts(prompts, completions, problem_keys)
        with self._lock:
            # History first, synchronously (cheap deque work): stats, digests and saved state see the push at once.
            new_ids, evicted = [], []
            for key, (prompt, comps) in groups.items():
                if not comps:
                    continue
                evicted += self._history.add(key, comps, prompt[-self.config.prompt_tail_tokens:]
                                             if self.config.prompt_tail_tokens else prompt[:0])
                new_ids.append(self._history.last_appearance_id)
                self._live.release_finished(key)
            if self._calibrator is not None and new_ids:
                self._calibrator.new_step()  # one push = one training step: older acceptance evidence weighs less
            gone = {app_id for _, app_id in evicted}
            removals = [a for a in gone if a not in new_ids]
            inserts = [self._history.appearance(a) for a in new_ids if a not in gone]
            summary["evicted"] = len(evicted)
            if not background and self._pending == 0:
                self._index.remove(removals)
                self._index.insert(inserts)
                return summary
            self._pending += 1  # trees are updated in push order, behind earlier queued updates
        future = self._executor().submit(self._index_in_background, removals, inserts)
        if not background:
            future.result()
        else:
            summary["queued"] = True
        return summary

    def _index_in_background(self, removals: list[int], inserts: list) -> None:
        started = time.perf_counter()
        try:
            with self._lock:
                self._index.remove(removals, self._yield_lock)
                self._index.insert(inserts, self._yield_lock)
        except Exception:  # pragma: no cover - inputs were validated; never kill the updater thread
            logger.exception("DAS tree update failed; drafts may miss this step's history")
            with self._lock:
                self._update_errors += 1
        finally:
            with self._lock:
                self._pending -= 1
                self._update_seconds += time.perf_counter() - started
                self._updates_done.notify_all()

    @contextmanager
    def _engine_lock(self) -> Iterator[None]:
        """The lock, for calls on the engine's critical path and quick RPCs (stats, state): announces the caller so
        that a background tree update pausing between two pieces waits until it got the lock (``RLock`` is not fair:
        a releasing thread may take it straight back, and under load the waiter starved for seconds)."""
        self._engine_waiting += 1
        try:
            self._lock.acquire()
        finally:
            self._engine_waiting -= 1
        try:
            yield
        finally:
            self._lock.release()

    def _yield_lock(self) -> None:
        """Let engine-path callers in between two pieces of tree work (the updater holds the lock once)."""
        self._lock.release()
        time.sleep(0)  # hands the GIL over too: arctic's tree calls hold it
        deadline = time.perf_counter() + 0.05
        while self._engine_waiting and time.perf_counter() < deadline:
            time.sleep(0.0001)
        self._lock.acquire()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._updater is None:
                self._updater = ThreadPoolExecutor(max_workers=1, thread_name_prefix="das-history")
            return self._updater

    def wait_for_updates(self, timeout: float | None = None) -> bool:
        """Block until every background ``add_rollouts`` has been applied.

        Args:
            timeout: seconds to wait at most (``None``: no limit).

        Returns:
            True when nothing is pending, False on timeout.
        """
        with self._lock:
            return self._updates_done.wait_for(lambda: self._pending == 0, timeout)

    # ------------------------------------------------------------------ requests
    def start_request(self, request_id: str, prompt_token_ids: Sequence[int] | np.ndarray,
                      problem_key: int | None = None) -> None:
        """Begin drafting for a request.

        Args:
            request_id: engine request id (any hashable str).
            prompt_token_ids: 1-D prompt ids in ``[0, 2**31)``.
            problem_key: explicit problem id; defaults to :func:`problem_key` of the prompt.

        Raises:
            ValueError: request already active, an id that is not a str or an int, or invalid prompt ids.
        """
        check_request_id(request_id)
        prompt = as_tokens(prompt_token_ids, "prompt_token_ids")
        key = _problem_key(prompt) if problem_key is None else int(problem_key)
        with self._engine_lock():
            self._live.start(request_id, prompt, key)
            self._unverified.pop(request_id, None)
            self._requests += 1

    def extend_request(self, request_id: str, new_token_ids: Sequence[int] | np.ndarray) -> None:
        """Append tokens just sampled/accepted for a request (its output grows).

        Raises:
            KeyError: unknown request. ValueError: invalid ids.
        """
        tokens = as_tokens(new_token_ids, "new_token_ids").tolist()
        with self._engine_lock():
            if request_id not in self._live:
                raise KeyError(f"request {request_id!r} is not active (call start_request first)")
            self._live.extend(request_id, tokens)

    def stop_request(self, request_id: str) -> None:
        """End a request. Its output stays visible to siblings and the batch tree until its
        problem's next push, within ``config.live_token_budget``: after the stop, while the
        finished outputs hold more tokens than that, the oldest finished output is dropped.

        Raises:
            KeyError: unknown request.
        """
        with self._engine_lock():
            if request_id not in self._live:
                raise KeyError(f"request {request_id!r} is not active")
            self._live.stop(request_id)
            self._unverified.pop(request_id, None)

    def problem_of(self, request_id: str) -> int:
        """Problem key of an active request. Raises ``KeyError`` if it is not active."""
        with self._engine_lock():
            return self._live.problem_of(request_id)

    def history_problems(self) -> list[int]:
        """Keys of the problems with history (a new list)."""
        with self._engine_lock():
            return self._history.problems()

    def history_lengths(self, problem_key: int) -> np.ndarray:
        """Completion lengths (tokens, ``np.int64``, oldest first) in a problem's window; empty if unknown."""
        with self._engine_lock():
            return self._history.lengths(problem_key)

    @property
    def active_requests(self) -> set[str]:
        """Ids of requests started and not stopped (a new set)."""
        with self._lock:
            return self._live.request_ids

    # ------------------------------------------------------------------ drafting
    def propose(self, request_id: str, context: np.ndarray | Sequence[int] | None, max_tokens: int) -> list[int]:
        """Draft the next tokens of a request.

        Args:
            request_id: an active request.
            context: the request's full context (prompt + output) or its tail; only the
                last ``match_context_tokens`` tokens are used (int array or sequence of ints).
                ``None``: the request's own prompt + the tokens given to :meth:`extend_request`.
            max_tokens: draft budget this round; the draft has at most
                ``min(max_tokens, config.max_spec_tokens)`` tokens. ``<= 0`` -> ``[]``.

        Returns:
            Chain draft (list of int), possibly empty; cut where the evidence-adjusted
            probability falls below ``min_token_prob``.

        Raises:
            KeyError: unknown request. ValueError: ``max_tokens`` is not an int.
        """
        if type(max_tokens) is not int:  # the replay's per-row calls pass ints: no array round trip for them
            max_tokens = int(count_array([max_tokens], "max_tokens", low=-TOKEN_LIMIT)[0])
        best = self._propose_one(request_id, context, max_tokens)
        return list(best.token_ids) if best is not None else []

    def propose_batch(self, request_ids: Sequence[str], max_tokens: Sequence[int] | np.ndarray,
                      contexts: Sequence[np.ndarray | Sequence[int] | None] | None = None) -> DraftBatch:
        """Draft for many requests at once (one engine step): :meth:`propose` per row, as arrays.

        Args:
            request_ids: ``n`` active requests.
            max_tokens: ``int [n]`` per-row budget (each capped at ``config.max_spec_tokens``; ``<= 0``: no draft).
            contexts: per-row context as in :meth:`propose`, or ``None`` for every row's own prompt + output.

        Returns:
            :class:`~das_trl.drafter.draft_batch.DraftBatch` of width ``config.max_spec_tokens`` with the calibrated
            per-position acceptance estimates of every draft.

        Raises:
            KeyError: an unknown request (drafts of earlier rows were made). ValueError: length mismatch, budgets
            that are not ints (strings, 2.7), or a request listed twice (nothing drafted).
        """
        n = len(request_ids)
        if len(set(request_ids)) != n:
            raise ValueError("propose_batch: a request is listed twice in request_ids")
        budgets = count_array(max_tokens, "max_tokens", low=-TOKEN_LIMIT)
        if len(budgets) != n or (contexts is not None and len(contexts) != n):
            raise ValueError(f"propose_batch: {n} request_ids but {len(budgets)} max_tokens"
                             + ("" if contexts is None else f" and {len(contexts)} contexts"))
        out = DraftBatch.empty(n, self.config.max_spec_tokens)
        for i, rid in enumerate(request_ids):
            best = self._propose_one(rid, None if contexts is None else contexts[i], int(budgets[i]))
            if best is None:
                continue
            k = len(best.token_ids)
            out.tokens[i, :k] = best.token_ids
            out.accept[i, :k] = best.accept
            out.lengths[i] = k
            out.source[i] = SOURCE_ORDER.index(best.source)
            out.match_len[i] = best.match_len
        return out

    def step(self, request_ids: Sequence[str], token_matrix: np.ndarray, rows: np.ndarray, num_tokens: np.ndarray,
             num_prompt: np.ndarray, num_sampled: np.ndarray, num_verified: np.ndarray,
             max_tokens: np.ndarray) -> DraftBatch:
        """One engine step for active requests whose texts live in a token matrix (vLLM's ``token_ids_cpu``).

        Row ``i`` is ``request_ids[i]``, with text ``token_matrix[rows[i], :num_tokens[i]]`` (prompt of
        ``num_prompt[i]`` tokens) and ``num_sampled[i] >= 1`` tokens gained this step. Per row: the previous draft's
        verification is reported (``accepted = min(verified, num_sampled - 1)``, ``verified`` = the draft length as
        sent, capped by ``num_verified[i]`` when ``>= 0``); the output tokens not yet seen are appended (a request
        whose output shrank, i.e. was preempted and recomputed, is restarted from its prompt); then every row is
        drafted with budget ``max_tokens[i]`` (:meth:`propose_batch`).

        Args:
            token_matrix: ``int [R, L]``; rows, num_tokens, num_prompt, num_sampled, num_verified, max_tokens:
                ``int [n]``.

        Raises:
            KeyError: an unknown request. ValueError: shapes or lengths out of range, or a request listed twice
            (nothing changed).
        """
        n = len(request_ids)
        if len(set(request_ids)) != n:
            raise ValueError("step: a request is listed twice in request_ids")
        cols = [np.asarray(a, dtype=np.int64).reshape(-1) for a in
                (rows, num_tokens, num_prompt, num_sampled, num_verified, max_tokens)]
        if any(len(a) != n for a in cols) or np.ndim(token_matrix) != 2:
            raise ValueError(f"step: {n} request_ids, every array needs n entries and token_matrix 2 dims")
        rows_, nt, npr, ns, nv, mt = cols
        R, L = np.shape(token_matrix)
        bad = (rows_ < 0) | (rows_ >= R) | (npr < 0) | (npr > nt) | (nt > L) | (ns < 0)
        if bad.any():
            i = int(np.nonzero(bad)[0][0])
            raise ValueError(f"step: row {i} has matrix row {rows_[i]}, num_prompt {npr[i]}, num_tokens {nt[i]} "
                             f"(matrix {R} x {L})")
        with self._engine_lock():
            for rid in request_ids:
                if rid not in self._live:
                    raise KeyError(f"request {rid!r} is not active (call start_request first)")
            for i, rid in enumerate(request_ids):
                text = token_matrix[rows_[i]]
                prompt_len, out_len = self._live.lengths(rid)
                num_output = int(nt[i] - npr[i])
                if out_len > num_output or prompt_len != npr[i]:
                    key = self._live.problem_of(rid)
                    self.stop_request(rid)
                    self.start_request(rid, text[:npr[i]], problem_key=key)
                    out_len = 0
                else:
                    pending = self._unverified.get(rid)
                    if pending is not None and ns[i] > 0:
                        verified = len(pending[2]) if nv[i] < 0 else min(len(pending[2]), int(nv[i]))
                        self.record_acceptance(rid, min(verified, int(ns[i]) - 1), verified)
                if num_output > out_len:
                    self.extend_request(rid, text[npr[i] + out_len:nt[i]])
            return self.propose_batch(request_ids, mt)

    def trim(self, request_ids: Sequence[str], lengths: Sequence[int] | np.ndarray) -> None:
        """Cut each request's outstanding draft to ``lengths[i]`` tokens: what was really sent for verification
        (e.g. after the budget controller). Counters follow (a draft cut to 0 is no draft). Unknown ids are ignored.

        Raises:
            ValueError: ``request_ids`` and ``lengths`` differ in length, or a length is negative or not an int."""
        if len(request_ids) != len(lengths):
            raise ValueError(f"trim: {len(request_ids)} request ids but {len(lengths)} lengths")
        lengths = count_array(lengths, "trim: lengths", low=0)
        with self._engine_lock():
            for rid, keep in zip(request_ids, lengths.tolist()):
                pending = self._unverified.get(rid)
                if pending is None or len(pending[2]) <= keep:
                    continue
                source, match_len, prior = pending
                self._draft_tokens -= len(prior) - max(keep, 0)
                if keep <= 0:
                    self._drafts -= 1
                    self._wins[source] -= 1
                    del self._unverified[rid]
                else:
                    self._unverified[rid] = (source, match_len, prior[:keep])

    def _propose_one(self, request_id: str, context, max_tokens: int):
        cfg = self.config
        if context is None:
            ctx = None
        else:
            tail = context[-cfg.match_context_tokens:]
            ctx = tail.tolist() if isinstance(tail, np.ndarray) else [int(t) for t in tail]
        with self._engine_lock():
            if request_id not in self._live:
                raise KeyError(f"request {request_id!r} is not active (call start_request first)")
            self._unverified.pop(request_id, None)  # a draft that was never reported verified teaches nothing
            k = min(int(max_tokens), cfg.max_spec_tokens)
            if k <= 0:
                return None
            if ctx is None:
                ctx = self._live.context_tail(request_id)
            self._proposals += 1
            key = self._live.problem_of(request_id)
            cands = self._index.candidates(key, ctx, k) + self._live.candidates(request_id, ctx, k)
            order = {s: i for i, s in enumerate(SOURCE_ORDER)}
            cands.sort(key=lambda c: order[c.source])
            best = choose(cands, cfg.evidence_pseudocount, cfg.match_len_pseudocount,
                          cfg.min_token_prob, cfg.truncate_by_evidence, self._calibrator)
            if best is None:
                return None
            self._unverified[request_id] = (best.source, best.match_len, best.prior)
            self._drafts += 1
            self._draft_tokens += len(best.token_ids)
            self._wins[best.source] += 1
            return best

    def record_acceptance(self, request_id: str, num_accepted: int, num_verified: int | None = None) -> None:
        """Report how many tokens of the request's last draft verification accepted (a prefix of the draft).

        Feeds the acceptance calibrator (``calibration.py``; a no-op with ``calibrate_acceptance=False``). Call it
        once per verified draft, before the next :meth:`propose` for the request; a report without a draft
        outstanding (none proposed, already reported, request restarted) is ignored, so callers may report every
        round.

        Args:
            request_id: the request.
            num_accepted: accepted draft tokens (clipped to ``[0, num_verified]``).
            num_verified: how many of the draft's tokens verification saw (vLLM trims a draft to fit the step's
                token budget; trimmed tokens were neither accepted nor rejected and teach nothing). ``None``: all.
        """
        with self._engine_lock():
            pending = self._unverified.pop(request_id, None)
            if pending is None:
                return
            source, match_len, prior = pending
            if num_verified is not None:
                prior = prior[:max(0, int(num_verified))]
            self._verified_drafts += 1
            self._verified_tokens += len(prior)
            self._accepted_tokens += min(max(int(num_accepted), 0), len(prior))
            if self._calibrator is not None and prior:
                self._calibrator.observe(source, match_len, prior, num_accepted)

    def acceptance_totals(self) -> tuple[int, int, int]:
        """``(verified drafts, verified draft tokens, accepted draft tokens)`` reported so far (cheap: for per-step
        deltas on the engine path)."""
        with self._engine_lock():
            return self._verified_drafts, self._verified_tokens, self._accepted_tokens

    def calibration(self) -> dict[str, list[list[list[float]]]]:
        """The calibrator's observed/predicted ratios, source -> [match-length bucket][prior bin] (buckets 1, 2,
        3-4, 5-8, 9+ tokens; bins 0.0-0.1, ..., 0.9-1.0); ``{}`` when calibration is off."""
        with self._engine_lock():
            return self._calibrator.table() if self._calibrator is not None else {}

    # ------------------------------------------------------------------ bookkeeping
    def stats(self) -> dict:
        """History stats plus ``proposals`` (propose calls with a budget), ``drafts``
        (non-empty drafts), ``draft_tokens``, ``requests`` (started), ``wins`` (dict
        source -> winning drafts), ``verified_drafts`` / ``accepted_tokens`` (reported by
        :meth:`record_acceptance`), ``calibration_tokens`` (verified draft tokens the calibrator
        learned from), index sizes, the live pool's figures (``LivePool.stats``:
        ``active_requests``, ``lingering_finished``, ``live_running_tokens``,
        ``live_finished_tokens`` (<= ``live_token_budget``), ``live_evicted_outputs``,
        ``live_evicted_tokens``, ``live_tree_tokens``, ``live_approx_bytes``), and the
        background updater's ``pending_updates``, ``update_errors`` and ``update_seconds``
        (time spent applying background updates, lock pauses included)."""
        with self._engine_lock():
            out = self._history.stats()
            out.update(self._index.stats())
            out.update(self._live.stats())
            out.update(proposals=self._proposals, drafts=self._drafts,
                       draft_tokens=self._draft_tokens, requests=self._requests,
                       wins=dict(self._wins), verified_drafts=self._verified_drafts,
                       accepted_tokens=self._accepted_tokens,
                       calibration_tokens=self._calibrator.observed_tokens if self._calibrator else 0,
                       pending_updates=self._pending,
                       update_errors=self._update_errors, update_seconds=self._update_seconds)
            return out

    def reset(self) -> None:
        """Drop history, trees, live requests and counters (config kept); waits for
        pending background updates first."""
        self.wait_for_updates()
        with self._lock:  # keep the lock object: other threads may be waiting on it
            self._clear()

    def state_dict(self) -> dict:
        """Persistable state: ``{"history": RolloutHistory.to_state(), "config": dict}``
        (numpy arrays, ints, plain dicts; no pickled objects)."""
        # No wait for background tree updates: the history itself is updated synchronously by add_rollouts.
        with self._engine_lock():
            return {"history": self._history.to_state(), "config": self.config.to_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Replace the history with a saved one and rebuild the trees.

        The current config's ``window``/``history_token_budget`` apply (a smaller one
        trims). Live requests are kept. Raises ``ValueError`` on a malformed state.
        """
        self.wait_for_updates()
        hist = RolloutHistory.from_state(history_state(state), self.config.window,
                                         self.config.history_token_budget)
        index = HistoryIndex(self.config, self._tree_factory)
        index.insert(list(hist.appearances()))
        with self._lock:
            self._history, self._index = hist, index

"""The Speculator's per-request records and the bookkeeping of one engine step around the controller's plan and cut.

Per request (by slot): problem key, rounds so far, ``max_tokens``, the draft tokens sent last step and their expected
acceptance, the fading record of accepted / rejected draft tokens (the gate's acceptance predictor) and of how often
its speculated drafts survived the cut (the gate's send rate); engine-wide, the same records over every request. Per
engine step, three calls:

1. :meth:`begin`: every row's round count + 1; whether any row had a draft in flight (else the step may be quiet).
2. :meth:`prepare`: last step's verification (records, totals for the controller), then the plan's inputs per row.
3. :meth:`finish`: after the drafter and the cut: planned rows that found no draft count as rejections, the drafting
   rows are cut in the step's output (in place) and in the drafter (``trim``), and what was sent is recorded (and
   whether each planned row sent anything).

:class:`RequestBook` is the numpy reference; :class:`NativeRequestBook` does the same in the drafter's native core
(``src/request_book.cc``) in three calls of scalar work instead of ~70 numpy calls (~1-3 us each on a small host),
with results equal bit for bit (``tests/test_request_book.py``). No vLLM import; not thread-safe (the Speculator
serialises calls).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from das_trl.drafter.draft_batch import DraftBatch

#: Per-token acceptance outcomes of a request fade by this factor at each of its verified drafts (the gate's memory).
OUTCOME_DECAY = 0.8
#: The engine-wide outcomes (every request's, the prior of a request with few of its own) fade by this per step.
GLOBAL_DECAY = 0.99


def _forget(book: Any, factor: float) -> None:
    """Scale a book's engine-wide records (numpy or native: the same four attributes) by ``factor``."""
    f = float(factor)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"request book: forget factor must be in [0, 1], got {factor!r}")
    for name in ("global_hits", "global_misses", "global_speculated", "global_sent_steps"):
        setattr(book, name, f * getattr(book, name))


def _check_send_rounds(send_rounds: float) -> None:
    if not (math.isfinite(float(send_rounds)) and float(send_rounds) >= 0.0):
        raise ValueError(f"request book: send_rounds must be a finite number >= 0, got {send_rounds!r}")


class PlanInputs(NamedTuple):
    """The plan's inputs for ``n`` rows (:meth:`~das_trl.budget.BudgetController.plan`): ``key`` ``int64`` problem
    keys, ``output_len`` ``int32`` tokens generated, ``rounds`` ``int64`` verification rounds, ``max_output``
    ``int64`` each request's ``max_tokens`` (else the model length), ``caps`` ``int32`` hard draft caps
    ``min(K, max_model_len - 1 - num_tokens) >= 0``, ``acceptance`` ``float64`` predicted per-token acceptance,
    ``send`` ``float64`` the chance that a draft of the row, if speculated, survives the cut."""

    key: np.ndarray
    output_len: np.ndarray
    rounds: np.ndarray
    max_output: np.ndarray
    caps: np.ndarray
    acceptance: np.ndarray
    send: np.ndarray


class Observed(NamedTuple):
    """Last step's verification: drafts verified, draft tokens accepted, draft tokens verified, and the sum of the
    controller's acceptance estimates for the verified tokens (:meth:`BudgetController.observe_acceptance`)."""

    verified_drafts: int
    accepted: int
    checked: int
    expected: float


class RequestBook:
    """Numpy reference of the per-request records (see the module docstring). Arrays indexed by slot, grown by
    doubling: at most as many slots as requests ever ran at once (``bytes``: their size).

    Args:
        prior / prior_rounds: the gate's acceptance prior in ``[0, 1)`` and its weight in pseudo-rounds
            (``ControllerConfig.gate_acceptance_prior`` / ``gate_prior_rounds``).
        send_rounds: the weight (pseudo-steps) of the engine-wide send rate in a request's (:meth:`send_rate`;
            ``ControllerConfig.gate_send_rounds``; 0: every row counts as sending).
    """

    _FIELDS = (("key", np.int64), ("rounds", np.int64), ("max_output", np.int64), ("sent", np.int64),
               ("expected", np.float64), ("hits", np.float64), ("misses", np.float64), ("speculated", np.float64),
               ("sent_steps", np.float64), ("dslot", np.int32))

    def __init__(self, prior: float = 0.5, prior_rounds: float = 2.0, capacity: int = 256,
                 send_rounds: float = 0.0) -> None:
        for name, dtype in self._FIELDS:
            setattr(self, name, np.zeros(capacity, dtype))
        self.set_prior(prior, prior_rounds, send_rounds)
        self.global_hits = 0.0
        self.global_misses = 0.0
        self.global_speculated = 0.0  # planned rows, fading by GLOBAL_DECAY per planned step
        self.global_sent_steps = 0.0  # those whose draft survived the cut

    def set_prior(self, prior: float, prior_rounds: float, send_rounds: float = 0.0) -> None:
        """Use these priors from the next step on. Raises ``ValueError`` when ``send_rounds`` is not a finite number
        >= 0 (nothing changed)."""
        _check_send_rounds(send_rounds)
        self.prior, self.prior_rounds, self.send_rounds = float(prior), float(prior_rounds), float(send_rounds)

    def reset(self, slot: int, key: int, max_output: int, dslot: int) -> None:
        """Start a request in ``slot`` (grows the arrays): problem key, max output tokens, its drafter slot (-1:
        none)."""
        if slot >= len(self.key):
            cap = max(slot + 1, 2 * len(self.key))
            for name, dtype in self._FIELDS:
                old = getattr(self, name)
                new = np.zeros(cap, dtype)
                new[: len(old)] = old
                setattr(self, name, new)
        self.key[slot] = key
        self.rounds[slot] = -1  # the first step of a request is round 0
        self.max_output[slot] = max_output
        self.sent[slot] = self.expected[slot] = self.hits[slot] = self.misses[slot] = 0
        self.speculated[slot] = self.sent_steps[slot] = 0.0
        self.dslot[slot] = dslot

    def begin(self, slots: np.ndarray, steps: int = 1) -> bool:
        """Every row's round count + ``steps`` (``slots``: ``int64 [n]``; several steps at once: the Speculator's
        quiet steps, recorded later); whether any row had a draft sent last step. Raises ``ValueError`` when
        ``steps < 1``."""
        if steps < 1:
            raise ValueError(f"request book: begin takes steps >= 1, got {steps}")
        self.rounds[slots] += steps
        return bool(self.sent[slots].any())

    def distinct(self, slots: np.ndarray) -> bool:
        """Whether the ``slots`` (``int64 [n]``, each a slot of this book) are pairwise distinct: no request listed
        twice in a step. Raises ``ValueError`` for a slot outside the book."""
        if len(slots) and (int(np.minimum.reduce(slots)) < 0 or int(np.maximum.reduce(slots)) >= len(self.key)):
            raise ValueError(f"request book: a slot outside [0, {len(self.key)})")
        return len(np.unique(slots)) == len(slots)

    def decay(self, steps: int = 1) -> None:
        """``steps`` steps that skipped the plan: only the engine-wide outcomes fade, once per step (the same products
        as one call per step)."""
        for _ in range(steps):
            self.global_hits *= GLOBAL_DECAY
            self.global_misses *= GLOBAL_DECAY

    def forget(self, factor: float) -> None:
        """Multiply the engine-wide records (acceptance outcomes, send rate) by ``factor`` in ``[0, 1]``: after a
        history push, drafting evidence gathered before it (drafts rejected, rows that found nothing to draft) says
        less about the drafts to come (see :meth:`~das_trl.vllm.speculator.Speculator.new_history`)."""
        _forget(self, factor)

    def prepare(self, slots: np.ndarray, num_sampled: np.ndarray, verified: np.ndarray, num_tokens: np.ndarray,
                num_prompt: np.ndarray, max_model_len: int, k: int) -> tuple[PlanInputs, Observed]:
        """Record last step's verification, then gather the plan's inputs.

        Args:
            slots: ``int64 [n]``; num_sampled / verified / num_tokens / num_prompt: ``int32 [n]`` (tokens gained
                this step, draft tokens vLLM scheduled last step or -1 for the whole draft, tokens, prompt tokens).
            max_model_len / k: the engine's model length and the hard cap K.
        """
        sent = self.sent[slots]
        idx = np.flatnonzero(sent)
        observed = Observed(0, 0, 0, 0.0)
        if len(idx):
            s, sent = slots[idx], sent[idx]
            ver = verified[idx]
            checked = np.where(ver >= 0, np.minimum(sent, ver), sent)
            accepted = np.minimum(checked, num_sampled[idx] - 1)
            total_accepted = int(accepted.sum())
            observed = Observed(len(idx), total_accepted, int(checked.sum()),
                                float((self.expected[s] * checked / sent).sum()))
            misses = accepted < checked
            self.hits[s] = OUTCOME_DECAY * self.hits[s] + accepted
            self.misses[s] = OUTCOME_DECAY * self.misses[s] + misses
            self.global_hits += float(total_accepted)
            self.global_misses += float(np.count_nonzero(misses))
        self.decay()
        caps = np.maximum(np.minimum(max_model_len - 1 - num_tokens, k), 0)  # int32, as num_tokens
        plan = PlanInputs(self.key[slots], num_tokens - num_prompt, self.rounds[slots],
                          self.max_output[slots], caps, self.acceptance(slots), self.send_rate(slots))
        return plan, observed

    def acceptance(self, slots: np.ndarray) -> np.ndarray:
        """Predicted per-token acceptance ``float64 [n]`` (a geometric model: ``hits / (hits + misses)``): the
        request's fading record, with ``prior_rounds`` pseudo-rounds at the engine-wide rate, itself the fading record
        of every request with 2 pseudo-rounds at the configured ``prior`` (so a step in which nothing was drafted
        drifts back towards the prior, and the gate tries again)."""
        q0, r0 = self.prior, self.prior_rounds
        g_hits = self.global_hits + 2.0 * q0 / (1.0 - q0)
        qg = min(g_hits / (g_hits + self.global_misses + 2.0), 0.99)
        hits = self.hits[slots] + r0 * qg / (1.0 - qg)
        return hits / (hits + self.misses[slots] + r0)

    def send_rate(self, slots: np.ndarray) -> np.ndarray:
        """The chance that a draft of each row, if speculated, survives the cut: ``float64 [n]``, the request's
        fading share of its speculated steps that sent a draft (``OUTCOME_DECAY`` per such step) with
        ``send_rounds`` pseudo-steps at the engine-wide share, itself with 2 pseudo-steps at 1; all ones when
        ``send_rounds`` is 0. The gate charges a row's proposer CPU divided by it: the gate predicts acceptance from
        the drafts that were sent, which the cut chose for their high estimates, so on a set where most speculated
        drafts are cut to nothing (AMC23 at c_tok 0.1: 78 %) it would keep speculating rows that send nothing."""
        r = self.send_rounds
        if r <= 0.0:
            return np.ones(len(slots))
        pg = (self.global_sent_steps + 2.0) / (self.global_speculated + 2.0)
        return (self.sent_steps[slots] + r * pg) / (self.speculated[slots] + r)

    def finish(self, slots: np.ndarray, planned: np.ndarray, drafting: np.ndarray, kept: np.ndarray,
               expected_kept: np.ndarray, out: DraftBatch, drafter: Any, req_ids: list[str] | None = None
               ) -> tuple[int, int]:
        """After the drafter's step and the cut.

        Args:
            slots: ``int64 [n]``; planned: ``bool [n]`` rows the plan drafted; drafting: ``int64 [m]`` rows with a
                draft (``out.lengths > 0``); kept: ``int32 [m]`` tokens the cut keeps; expected_kept: ``float64 [m]``
                their acceptance estimate (``BudgetController.last_expected_kept``).
            out: the step's drafts, cut here in place.
            drafter: told what was really sent: ``trim_slots`` by the book's drafter slots when it has it, else
                ``trim`` by ``req_ids`` (the rows' request ids); ``None``: not told.

        Returns:
            ``(drafts, draft tokens)`` sent for verification.

        Raises:
            ValueError: ``kept`` / ``expected_kept`` / ``planned`` of the wrong length (nothing changed).
        """
        if len(kept) != len(drafting) or len(expected_kept) != len(drafting) or len(planned) != len(slots):
            raise ValueError(f"finish: {len(drafting)} drafting rows need as many kept / expected_kept entries (got "
                             f"{len(kept)} / {len(expected_kept)}), and planned one per row ({len(slots)}, got "
                             f"{len(planned)})")
        self._rejected_empty(slots, planned, out.lengths)
        drafts = tokens = 0
        if len(drafting):
            out.truncate_rows(drafting, kept)
            sent = out.lengths[drafting]
            if drafter is not None and hasattr(drafter, "trim_slots"):
                drafter.trim_slots(self.dslot[slots[drafting]], sent)
            elif drafter is not None:
                drafter.trim([req_ids[i] for i in drafting.tolist()], sent)
            self.expected[slots[drafting]] = expected_kept
            drafts, tokens = int(np.count_nonzero(sent)), int(sent.sum())
        self.sent[slots] = out.lengths
        # whether each planned row sent anything (send_rate)
        rows = slots[planned]
        sends = out.lengths[planned] > 0
        self.speculated[rows] = OUTCOME_DECAY * self.speculated[rows] + 1.0
        self.sent_steps[rows] = OUTCOME_DECAY * self.sent_steps[rows] + sends
        self.global_speculated = GLOBAL_DECAY * self.global_speculated + float(len(rows))
        self.global_sent_steps = GLOBAL_DECAY * self.global_sent_steps + float(np.count_nonzero(sends))
        return drafts, tokens

    def _rejected_empty(self, slots: np.ndarray, planned: np.ndarray, lengths: np.ndarray) -> None:
        # A planned row the drafter found nothing for counts as a rejection in its record: otherwise a request that
        # never matches would never learn it, and would be planned again every step.
        empty = slots[planned & (lengths == 0)]
        if len(empty):
            self.misses[empty] = OUTCOME_DECAY * self.misses[empty] + 1.0
            self.hits[empty] *= OUTCOME_DECAY
            self.global_misses += len(empty)

    def bytes(self) -> int:
        """Bytes held by the per-slot arrays."""
        return sum(getattr(self, name).nbytes for name, _ in self._FIELDS)


class NativeRequestBook:
    """:class:`RequestBook` in the drafter's native core (``_das_native.RequestBook``; same methods and results).
    The plan-input arrays are views of buffers reused across steps (valid until the next :meth:`prepare`).

    Args:
        module: the loaded native module (:func:`das_trl.drafter.native.load`); prior / prior_rounds: as
            :class:`RequestBook`.
    """

    def __init__(self, module: Any, prior: float = 0.5, prior_rounds: float = 2.0, send_rounds: float = 0.0) -> None:
        self._book = module.RequestBook()
        self.set_prior(prior, prior_rounds, send_rounds)
        self._bufs: list[np.ndarray] = []
        self._cap = 0
        self._grow(64)  # allocated up front: an empty first step (only partial prefills) needs them too
        self._inputs: PlanInputs | None = None  # views of the buffers' first _inputs_n entries
        self._inputs_n = -1
        self._empty_i32 = np.zeros(0, np.int32)
        self._empty_f64 = np.zeros(0, np.float64)

    def set_prior(self, prior: float, prior_rounds: float, send_rounds: float = 0.0) -> None:
        _check_send_rounds(send_rounds)
        self._book.set_prior(float(prior), float(prior_rounds), float(send_rounds))

    def reset(self, slot: int, key: int, max_output: int, dslot: int) -> None:
        self._book.reset(int(slot), int(key), int(max_output), int(dslot))

    def begin(self, slots: np.ndarray, steps: int = 1) -> bool:
        return self._book.begin(slots, steps)

    def distinct(self, slots: np.ndarray) -> bool:
        return self._book.distinct(slots)

    def decay(self, steps: int = 1) -> None:
        self._book.decay(steps)

    def forget(self, factor: float) -> None:
        """As :meth:`RequestBook.forget`."""
        _forget(self._book, factor)

    def prepare(self, slots: np.ndarray, num_sampled: np.ndarray, verified: np.ndarray, num_tokens: np.ndarray,
                num_prompt: np.ndarray, max_model_len: int, k: int) -> tuple[PlanInputs, Observed]:
        n = len(slots)
        if self._inputs_n != n:  # the same views while the batch size holds
            if n > self._cap:
                self._grow(max(n, 2 * self._cap))
            self._inputs, self._inputs_n = PlanInputs(*(b[:n] for b in self._bufs)), n
        observed = self._book.prepare(slots, num_sampled, verified, num_tokens, num_prompt, int(max_model_len),
                                      int(k), *self._inputs)
        return self._inputs, Observed(*observed)

    def _grow(self, cap: int) -> None:
        self._cap = cap
        self._bufs = [np.zeros(cap, dt)
                      for dt in (np.int64, np.int32, np.int64, np.int64, np.int32, np.float64, np.float64)]

    def finish(self, slots: np.ndarray, planned: np.ndarray, drafting: np.ndarray, kept: np.ndarray,
               expected_kept: np.ndarray, out: DraftBatch, drafter: Any, req_ids: list[str] | None = None
               ) -> tuple[int, int]:
        """As :meth:`RequestBook.finish`; ``drafter`` must be a native drafter (or ``None``)."""
        if not len(drafting):
            kept, expected_kept = self._empty_i32, self._empty_f64
        elif kept.dtype != np.int32 or expected_kept.dtype != np.float64:
            kept, expected_kept = kept.astype(np.int32), expected_kept.astype(np.float64)
        return self._book.finish(slots, planned, drafting, kept, expected_kept, out.tokens, out.accept, out.lengths,
                                 out.source, out.match_len, None if drafter is None else drafter._core)

    def records(self) -> dict[str, np.ndarray]:
        """Copies of the per-slot arrays (tests): the :class:`RequestBook` fields."""
        n = self._book.size()
        out = {name: np.asarray(self._book.ints(i), np.int64)[:n]
               for i, name in enumerate(("key", "rounds", "max_output", "sent", "dslot"))}
        out.update({name: np.asarray(self._book.doubles(i), np.float64)[:n]
                    for i, name in enumerate(("expected", "hits", "misses", "speculated", "sent_steps"))})
        return out

    @property
    def global_hits(self) -> float:
        return self._book.global_hits

    @property
    def global_misses(self) -> float:
        return self._book.global_misses

    @property
    def global_speculated(self) -> float:
        return self._book.global_speculated

    @property
    def global_sent_steps(self) -> float:
        return self._book.global_sent_steps

    def bytes(self) -> int:
        """Bytes held by the native records and this wrapper's buffers."""
        return int(self._book.bytes()) + sum(b.nbytes for b in self._bufs)

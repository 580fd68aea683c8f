"""One engine step of DAS speculation for a batch, as arrays: plan, draft, cut (no vLLM import).

The vLLM proposer (``proposer.py``) feeds it from the model runner; the replay benchmark (``das_trl.bench``) drives
the same object from recorded rollouts, so the replay measures exactly the calls the engine waits for. Per step:

1. **Report** the previous drafts' verification: to the drafter (inside its ``step``), to the controller (how its
   kept drafts fared) and to each request's acceptance record (the gate's predictor).
2. **Plan** (:meth:`BudgetController.plan`): who finishes last, and which rows can pay for a draft at all, counting
   the proposer's own CPU per drafted row. Rows that cannot are not drafted; a step where none can costs the
   drafter only the hand-over of the new tokens (ingested off the critical path where the core supports it). After
   a step where nothing paid, the plan itself is skipped until something it rests on is due to change
   (:meth:`BudgetController.quiet_step`): such a step is O(1) Python plus the drafter's hand-over.
3. **Draft** the planned rows in one drafter call, each up to the length the plan set for it
   (:func:`~das_trl.budget.gate.draft_caps`: no longer than its estimates can pay for, within the hard cap
   ``num_speculative_tokens`` and the model length).
4. **Cut** (:meth:`BudgetController.cut`): keep, per drafted row, the tokens that pay, and never more tokens in the
   step than the engine schedules (``max_step_tokens``: vLLM's scheduler token budget) or its memory profile covers
   (``max_step_drafts`` / ``max_draft_len``: :mod:`das_trl.vllm.verification_profile`); the drafter is told what was
   really sent (``trim``) so verification is accounted against the cut length.

The per-request records and the bookkeeping around plan and cut (verification, the gate's acceptance predictor, the
cut of the output, the drafter's trim) live in a request book (:mod:`das_trl.vllm.request_book`): in the drafter's
native core when the drafter is native (three calls per step), else the numpy reference. Cost per step: the plan and
the cut (O(rows) numpy and native kernels), the drafter's call and those three; the request-id -> slot mapping is
rebuilt only when the batch's request list changed. Not thread-safe (vLLM calls the proposer from one thread).
"""

from __future__ import annotations

import time
from operator import itemgetter
from typing import Any, Sequence

import numpy as np

from das_trl.budget import BudgetController
from das_trl.budget.step_cap import cap_step_tokens
from das_trl.drafter.draft_batch import DraftBatch
from das_trl.drafter.tokens import _INT32, int32_array
from das_trl.vllm.filled_views import FilledViews

from .request_book import NativeRequestBook, RequestBook


class Speculator:
    """Drafter + budget controller for one engine, per step (see the module docstring).

    Args:
        drafter: a drafter from :func:`das_trl.drafter.create_drafter` (its ``max_spec_tokens`` is the hard cap K).
        controller: the :class:`~das_trl.budget.BudgetController`.
        max_model_len: the engine's model length: a draft never runs past it.
        native_book: keep the per-request records in the native core (:class:`NativeRequestBook`; same results as
            the numpy :class:`RequestBook`); ``None``: when the drafter is native.
        max_step_tokens: the most tokens the engine schedules in one step (vLLM's scheduler token budget,
            ``max_num_scheduled_tokens``, draft tokens included): the step's rows plus their kept draft tokens never
            exceed it (:func:`~das_trl.budget.step_cap.cap_step_tokens`, far positions cut first); ``None``: no cap.
        max_step_drafts: the most draft tokens one step verifies (the engine's profiled verification shape,
            :mod:`das_trl.vllm.verification_profile`), cut the same way; ``None``: no limit.
        max_draft_len: the most draft tokens of one row (the profiled shape where vLLM's logprob path is padded to
            the longest draft); ``None``: no limit.

    Raises:
        ValueError: ``native_book=True`` with a drafter that is not native, ``max_model_len < 1``,
        ``max_step_tokens < 1``, or ``max_step_drafts`` / ``max_draft_len`` below 0.
    """

    def __init__(self, drafter: Any, controller: BudgetController, max_model_len: int,
                 native_book: bool | None = None, max_step_tokens: int | None = None,
                 max_step_drafts: int | None = None, max_draft_len: int | None = None) -> None:
        if int(max_model_len) < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        if max_step_tokens is not None and int(max_step_tokens) < 1:
            raise ValueError(f"max_step_tokens must be >= 1 (vLLM's scheduler token budget) or None, got "
                             f"{max_step_tokens}")
        for name, value in (("max_step_drafts", max_step_drafts), ("max_draft_len", max_draft_len)):
            if value is not None and int(value) < 0:
                raise ValueError(f"{name} must be >= 0 or None (no limit), got {value}")
        self.drafter = drafter
        self.controller = controller
        self.max_model_len = int(max_model_len)
        self.max_step_tokens = None if max_step_tokens is None else int(max_step_tokens)
        self.max_step_drafts = None if max_step_drafts is None else int(max_step_drafts)
        self.max_draft_len = None if max_draft_len is None else int(max_draft_len)
        self._slot_of: dict[str, int] = {}
        self._free: list[int] = []
        self._by_slot = hasattr(drafter, "step_slots")
        module = getattr(drafter, "_mod", None)
        if native_book is None:  # the native records go with the native drafter (its core trims in the same call)
            native_book = self._by_slot and hasattr(module, "RequestBook")
        elif native_book and not (self._by_slot and hasattr(module, "RequestBook")):
            raise ValueError("native_book=True needs the native drafter (backend 'native' or 'auto' with the core built)")
        cfg = controller.config
        self._book: RequestBook | NativeRequestBook = (
            NativeRequestBook(module, cfg.gate_acceptance_prior, cfg.gate_prior_rounds, cfg.gate_send_rounds)
            if native_book else RequestBook(cfg.gate_acceptance_prior, cfg.gate_prior_rounds,
                                            send_rounds=cfg.gate_send_rounds))
        self._buffer: DraftBatch | None = None
        self._views: DraftBatch | None = None
        self._quiet_run = 0  # quiet steps of the rows in _last_slots whose round and decay the book has not had yet
        self.set_controller(controller)
        self._last_ids: list[str] | None = None
        self._last_slots = np.zeros(0, np.int64)
        self._dslot = np.zeros(256, np.int32)  # per slot: the request's slot in the native drafter
        self._last_dslots = np.zeros(0, np.int32)
        self._silent = False  # the last step sent no draft
        self._sent = 0  # drafts the last step returned (rows with a draft after the cut)
        self.last_plan = None  # the last step's StepPlan (None after a quiet step), for diagnostics (the replay's
        # reliability record: BudgetController.predicted_acceptance)
        self._filled = FilledViews()  # constant int32 rows (0: no budget, -1: whole draft verified)
        self._views_key: tuple[int, int] | None = None  # (rows, K) of self._views
        self._no_rows = (np.zeros(0, np.int32), np.zeros(0, np.float64))
        self.counters = dict(steps=0, request_rounds=0, speculated_rows=0, silent_steps=0, quiet_steps=0, drafts=0,
                             draft_tokens=0, verified_drafts=0, accepted_tokens=0, capped_steps=0,
                             peak_step_tokens=0, peak_step_drafts=0, peak_draft_len=0)

    def set_controller(self, controller: BudgetController) -> None:
        """Use another budget controller from the next step on (tracked requests keep their records)."""
        if self._quiet_run:
            self._settle()
        self.controller = controller
        cfg = controller.config
        self._measure_rows = cfg.draft_row_source == "measured"
        self._book.set_prior(cfg.gate_acceptance_prior, cfg.gate_prior_rounds, cfg.gate_send_rounds)

    @property
    def drafted(self) -> bool:
        """Whether the last :meth:`step` returned any draft (``False`` before the first step)."""
        return self._sent > 0

    @property
    def book(self) -> RequestBook | NativeRequestBook:
        """The per-request records (:mod:`das_trl.vllm.request_book`), current to the last step."""
        if self._quiet_run:
            self._settle()
        return self._book

    # ------------------------------------------------------------------ requests
    def start(self, req_id: str, prompt_token_ids: np.ndarray | Sequence[int], problem_key: int | None = None,
              max_output: int | None = None) -> None:
        """Begin tracking a request (the drafter's live state and a slot in the per-request arrays).

        Args:
            prompt_token_ids: ``int`` token ids of the prompt.
            problem_key: explicit problem key (``None``: the hash of the prompt).
            max_output: the request's ``max_tokens`` (``None`` or <= 0: the model length); caps its remaining length.

        Raises:
            ValueError: the request is already tracked, ``max_output`` not an int, or bad ids / key (from the
            drafter).
        """
        if req_id in self._slot_of:
            raise ValueError(f"request {req_id!r} is already tracked")
        if max_output is not None and (not isinstance(max_output, (int, np.integer)) or isinstance(max_output, bool)):
            raise ValueError(f"max_output must be an int or None, got {max_output!r}")
        # The native drafter takes slots directly (no per-row id lookup per step); the reference takes ids.
        if self._by_slot:
            dslot, key = self.drafter.start_slot(req_id, prompt_token_ids, problem_key=problem_key)
        else:
            self.drafter.start_request(req_id, prompt_token_ids, problem_key=problem_key)
            dslot, key = -1, self.drafter.problem_of(req_id)
        if self._quiet_run:  # the reset below may reuse a slot of the recorded-later rows
            self._settle()
        slot = self._free.pop() if self._free else len(self._slot_of)
        self._slot_of[req_id] = slot
        if slot >= len(self._dslot):
            self._dslot = np.concatenate([self._dslot, np.zeros(max(slot + 1, len(self._dslot)), np.int32)])
        self._dslot[slot] = dslot
        self._book.reset(slot, key, int(max_output) if max_output is not None and max_output > 0
                         else self.max_model_len, dslot)
        self._last_ids = None

    def finish(self, req_id: str) -> None:
        """Stop tracking a request (its text lingers in the drafter for siblings). Unknown ids are ignored."""
        slot = self._slot_of.pop(req_id, None)
        if slot is not None:
            if self._quiet_run:
                self._settle()
            self._free.append(slot)
            self.drafter.stop_request(req_id)
            self._last_ids = None

    def new_history(self, decay: float | None = None) -> None:
        """A history push happened (a GRPO step's rollouts entered the drafter): what the gate learned engine-wide
        before it (drafts rejected, planned rows that found nothing to draft, e.g. a first step without history)
        says less about the drafts to come, so those records fade by ``decay`` (default: the drafter's
        ``calibration_step_decay``, as its calibration fades per push), and the plan runs at the next step instead of
        waiting out a quiet backoff."""
        if decay is None:
            decay = getattr(self.drafter.config, "calibration_step_decay", 0.5)
        if self._quiet_run:  # the quiet steps' fading came before this push
            self._settle()
        self._book.forget(decay)
        self.controller.history_pushed()

    def tracked(self) -> list[str]:
        """Ids of the tracked requests (a new list)."""
        return list(self._slot_of)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._slot_of

    def __len__(self) -> int:
        """Requests tracked."""
        return len(self._slot_of)

    def forget(self) -> None:
        """Forget every tracked request without stopping it in the drafter (after the drafter was reset)."""
        if self._quiet_run:
            self._settle()
        self._slot_of.clear()
        self._free.clear()
        self._last_ids = None

    # ------------------------------------------------------------------ per step
    def step(self, req_ids: list[str], token_matrix: np.ndarray, rows: np.ndarray, num_tokens: np.ndarray,
             num_prompt: np.ndarray, num_sampled: np.ndarray, num_verified: np.ndarray | None = None,
             step_ms: float | None = None) -> DraftBatch:
        """One engine step for the tracked requests ``req_ids`` (each row got at least one token this step).

        Args:
            req_ids: ``n`` tracked request ids (the list is compared with the last step's to reuse the slot lookup).
            token_matrix: ``int32 [R, L]`` every row's tokens (vLLM's ``token_ids_cpu``), read in place.
            rows: ``int [n]`` each request's row in ``token_matrix``.
            num_tokens / num_prompt: ``int [n]`` tokens (prompt + output, drafts excluded) / prompt tokens per row.
            num_sampled: ``int [n]`` tokens each row gained this step (accepted drafts + 1).
            num_verified: ``int [n]`` draft tokens vLLM scheduled last step per row (-1 / ``None``: the whole draft
                sent).
            step_ms: how long the engine step that produced these tokens took (ms), when every one of its tokens is
                accounted for here (no prefill chunks); only the opt-in online cost fit (``cost_source="online"``)
                reads it, because measured times make budgets, and so sampled rollouts, differ run to run.

        Returns:
            :class:`~das_trl.drafter.draft_batch.DraftBatch` of ``n`` rows, cut to what pays; its arrays are reused
            by the next step (copy what must outlive it).

        Raises:
            KeyError: a request is not tracked. ValueError: an id twice or arrays not of ``n`` entries (nothing
            changed); rows or lengths out of range for ``token_matrix`` (from the drafter, after this step's records
            were updated).
        """
        n = len(req_ids)
        same_rows = req_ids == self._last_ids
        if same_rows:
            slots = self._last_slots
        else:
            if self._quiet_run:  # before _last_slots moves on
                self._settle()
            try:  # the dict lookups in one C call (itemgetter), then one conversion
                slots = np.fromiter(itemgetter(*req_ids)(self._slot_of) if n > 1 else map(self._slot_of.__getitem__,
                                                                                          req_ids), np.int64, n)
            except KeyError as e:
                raise KeyError(f"request {e.args[0]!r} is not tracked (start it first)") from None
            # an id twice is a slot twice (one pass in the native book; a set of the ids cost 5-27 us at 150-556 rows)
            if len(self._slot_of) < n or not self._book.distinct(slots):
                raise ValueError("step: a request id appears twice in req_ids")
            self._last_ids, self._last_slots = list(req_ids), slots
            self._last_dslots = self._dslot[slots]
        # int32 as vLLM holds them (other integer arrays are converted once here; the drafter then takes them without
        # checking again); their lengths are checked before any record changes
        rows = int32_array(rows, "rows", n)
        num_tokens = int32_array(num_tokens, "num_tokens", n)
        num_prompt = int32_array(num_prompt, "num_prompt", n)
        num_sampled = int32_array(num_sampled, "num_sampled", n)
        verified = self._filled(-1, n) if num_verified is None else int32_array(num_verified, "num_verified", n)
        book = self._book
        # the proposer's CPU per drafted row, measured only when the gate prices it so (draft_row_source="measured")
        t0 = time.thread_time() if self._measure_rows else None
        # After a step that sent no draft no row has one in flight (each row's sent count is that step's 0, or a
        # quiet step's, which sends nothing; a request started since has none): a quiet step's round and decay are
        # then recorded later, all at once for its rows (_settle, before _last_slots moves on; the same integers and
        # products), so such a step makes no call to the book, whether or not the rows changed.
        lazy = self._silent and n
        if not lazy:
            if self._quiet_run:
                self._settle()
            in_flight = book.begin(slots)
        if n and self._silent and (lazy or not in_flight) and self.controller.quiet_step(slots, same_rows):
            if lazy:
                self._quiet_run += 1
            else:
                book.decay()
            out = self._quiet_step(req_ids, slots, token_matrix, rows, num_tokens, num_prompt, num_sampled, verified)
            if t0 is not None:
                self.controller.observe_proposer(n, 0, time.thread_time() - t0)
            return out
        if lazy:
            if self._quiet_run:
                self._settle()
            book.begin(slots)
        k = self.drafter.config.max_spec_tokens
        inputs, observed = book.prepare(slots, num_sampled, verified, num_tokens, num_prompt, self.max_model_len, k)
        ctl = self.controller
        c = self.counters
        if observed.verified_drafts:
            ctl.observe_acceptance(observed.expected, observed.accepted)
            # Counted here, not read back from the drafter: its counters wait for a deferred ingest in progress,
            # which would put the ingest thread's work back on the engine's critical path.
            c["verified_drafts"] += observed.verified_drafts
            c["accepted_tokens"] += observed.accepted
        if step_ms is not None and n and ctl.config.cost_source == "online":
            ctl.observe_step(n + observed.checked, step_ms)
        plan = ctl.plan(inputs.key, inputs.output_len, inputs.rounds, inputs.max_output, inputs.caps, inputs.acceptance,
                        slots, inputs.send, same_rows=same_rows, _prechecked=True)
        self.last_plan = plan
        planned = plan.drafted
        # Each planned row is drafted to the cap the plan set for it (draft_caps: no longer than can pay), the others
        # not at all (their budget is 0).
        out = self._drafter_step(req_ids, token_matrix, rows, num_tokens, num_prompt, num_sampled, verified, plan.budget,
                                 k, release=False)
        drafting = out.lengths.nonzero()[0]  # np.flatnonzero without its ravel (lengths is 1-D)
        if len(drafting):
            kept = ctl.cut(plan, out.accept[drafting], drafting, _prechecked=True)
            expected_kept = ctl.last_expected_kept
            room = self._draft_room(n)
            longest = self.max_draft_len
            if (room is not None and int(kept.sum()) > room) or (longest is not None and int(kept.max()) > longest):
                kept, expected_kept = self._fit_step(out, drafting, kept, expected_kept, room, longest)
        else:
            kept, expected_kept = self._no_rows
        drafts, draft_tokens = book.finish(slots, plan.draft, drafting, kept, expected_kept, out, self.drafter,
                                           req_ids)
        if self._by_slot:  # the idle rows' tokens go to the ingest thread only now: the trim did not wait for them
            self.drafter.release_ingest()
        self._silent = not len(drafting)
        self._sent = drafts
        c["steps"] += 1
        c["request_rounds"] += n
        c["speculated_rows"] += planned
        c["silent_steps"] += int(not planned)
        c["drafts"] += drafts
        c["draft_tokens"] += draft_tokens
        if n + draft_tokens > c["peak_step_tokens"]:  # the most tokens a step offered the engine (rows + drafts)
            c["peak_step_tokens"] = n + draft_tokens
        if len(kept):  # the most draft tokens one step verified, and one row (no row above the step's total)
            c["peak_step_drafts"] = max(c["peak_step_drafts"], draft_tokens)
            if draft_tokens > c["peak_draft_len"]:
                c["peak_draft_len"] = max(c["peak_draft_len"], int(kept.max()))
        if t0 is not None:
            ctl.observe_proposer(n, planned, time.thread_time() - t0)
        return out

    def _draft_room(self, n: int) -> int | None:
        """The most draft tokens a step of ``n`` rows may keep: the scheduler's budget left after one token per row,
        and the profiled verification limit (``None``: neither is set)."""
        if self.max_step_tokens is None and self.max_step_drafts is None:
            return None
        rooms = [limit for limit in (None if self.max_step_tokens is None else self.max_step_tokens - n,
                                     self.max_step_drafts) if limit is not None]
        return max(min(rooms), 0) if rooms else None

    def _fit_step(self, out: DraftBatch, drafting: np.ndarray, kept: np.ndarray, expected_kept: np.ndarray,
                  room: int | None, longest: int | None) -> tuple[np.ndarray, np.ndarray]:
        """The cut's kept lengths capped to ``longest`` per row and ``room`` draft tokens in all
        (:func:`cap_step_tokens`; ``None``: no such cap), and their expected accepted tokens scaled by the share of
        the drafter's estimates that remains (a step whose drafts would overflow the engine's token budget or its
        profiled verification shape)."""
        capped = kept if longest is None else np.minimum(kept, longest)
        capped = cap_step_tokens(capped, int(capped.sum()) if room is None else room)
        acc = out.accept[drafting]
        cols = np.arange(acc.shape[1])[None, :]
        before = np.where(cols < kept[:, None], acc, 0.0).sum(axis=1)
        after = np.where(cols < capped[:, None], acc, 0.0).sum(axis=1)
        scale = np.divide(after, before, out=np.zeros_like(after), where=before > 0)
        self.counters["capped_steps"] += 1
        return capped, expected_kept * scale

    def _quiet_step(self, req_ids: list[str], slots: np.ndarray, token_matrix: np.ndarray, rows: np.ndarray,
                    num_tokens: np.ndarray, num_prompt: np.ndarray, num_sampled: np.ndarray,
                    verified: np.ndarray) -> DraftBatch:
        """A step the controller let skip its plan (:meth:`BudgetController.quiet_step`): nothing was drafted last
        step and nothing is drafted now, so there is no verification to learn from and nothing to cut; the drafter
        only takes the new tokens (off the critical path where it defers its ingest). The book's round and decay
        were recorded by the caller."""
        self.last_plan = None
        self._sent = 0
        n = len(slots)
        if self._by_slot:  # _drafter_step's native call, without its budgets' dtype check (_filled is int32)
            out = self.drafter.step_slots(self._last_dslots, token_matrix, rows, num_tokens, num_prompt, num_sampled,
                                          verified, self._filled(0, n),
                                          self._out_buffer(n, self.drafter.config.max_spec_tokens), True,
                                          _prechecked=True)
        else:
            out = self._drafter_step(req_ids, token_matrix, rows, num_tokens, num_prompt, num_sampled, verified,
                                     self._filled(0, n), self.drafter.config.max_spec_tokens)
        c = self.counters
        c["steps"] += 1
        c["request_rounds"] += n
        c["silent_steps"] += 1
        c["quiet_steps"] += 1
        return out

    def _settle(self) -> None:
        """Record the pending quiet steps in the book: a round for each of their rows (``_last_slots``) and the
        engine-wide fading, once per step."""
        k, self._quiet_run = self._quiet_run, 0
        self._book.begin(self._last_slots, k)
        self._book.decay(k)

    def _drafter_step(self, req_ids: list[str], token_matrix: np.ndarray, rows: np.ndarray, num_tokens: np.ndarray,
                      num_prompt: np.ndarray, num_sampled: np.ndarray, verified: np.ndarray, budgets: np.ndarray,
                      k: int, release: bool = True) -> DraftBatch:
        """The drafter's step (``k``: its ``max_spec_tokens``): by slot into the reused output buffer (native;
        ``release``: see ``NativeDASDrafter.step_slots``), without validating again what :meth:`step` validated,
        else by request id."""
        if self._by_slot:
            if budgets.dtype is not _INT32:  # int32 from either book (caps in [0, K]); kept so for the drafter's call
                budgets = budgets.astype(np.int32)
            return self.drafter.step_slots(self._last_dslots, token_matrix, rows, num_tokens, num_prompt,
                                           num_sampled, verified, budgets, self._out_buffer(len(rows), k), release,
                                           _prechecked=True)
        return self.drafter.step(req_ids, token_matrix, rows, num_tokens, num_prompt, num_sampled, verified, budgets)

    def _out_buffer(self, n: int, k: int) -> DraftBatch:
        """The first ``n`` rows of one output batch of width ``k`` reused across steps (a new one per step cost
        ~0.3 us per row); valid until the next :meth:`step`. Grows by doubling."""
        if self._views_key != (n, k):  # the same views while the batch size holds
            buf = self._buffer
            if buf is None or len(buf) < n or buf.tokens.shape[1] != k:
                buf = self._buffer = DraftBatch.empty(max(n, 2 * (len(buf) if buf is not None else 0), 64), k)
            self._views = DraftBatch(buf.tokens[:n], buf.lengths[:n], buf.accept[:n], buf.source[:n],
                                     buf.match_len[:n])
            self._views_key = (n, k)
        return self._views

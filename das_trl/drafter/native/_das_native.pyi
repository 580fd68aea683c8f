"""Type stub of the drafter's compiled core, ``das_trl.drafter.native._das_native`` (C++17 + nanobind; sources in
``src/``, bindings in ``src/bindings.cc``). Import it only through :func:`das_trl.drafter.native.load`.

Conventions of every method:

- Array arguments are borrowed for the call only (history tokens are copied before it returns); they must be
  C-contiguous numpy arrays on the CPU with exactly the dtype shown (``int32``, ``int64``, ``int8``, ``float64``).
  Inputs are read-only (read-only arrays are accepted; other dtypes / layouts are converted to a temporary copy);
  outputs are caller-owned buffers that are filled in place, so an output of another dtype or layout is rejected
  (``TypeError``) rather than converted (its result would be lost in the copy).
- Invalid input (wrong row counts, bad offsets, out-of-range configuration) raises ``ValueError`` with the values;
  an unknown or inactive slot raises ``KeyError``.
- ``Drafter`` methods take the drafter's mutex (the ingest thread holds it while it ingests a deferred step); every
  call that drafts, may wait for that thread or for history builds releases the GIL, as do the controller kernels
  (:func:`controller_budgets`, :func:`controller_cut`, :func:`controller_plan`).
"""

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_SPEC_TOKENS", "Drafter", "RequestBook", "controller_budgets", "controller_cut", "controller_plan",
           "controller_rows_seen", "controller_scratch_bytes"]

_B = npt.NDArray[np.bool_]
_I8 = npt.NDArray[np.int8]
_I32 = npt.NDArray[np.int32]
_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]

#: The largest ``max_spec_tokens`` (K) a :class:`Drafter` accepts.
MAX_SPEC_TOKENS: int

class StepOutputs:
    """A step's five output arrays (a DraftBatch's), held with their references for :meth:`Drafter.step_into`, which
    writes into them in place (the Speculator reuses one batch of views while the batch size holds: converted once
    instead of five array conversions per step). The arrays must already have these dtypes and be C-contiguous and
    writable (never converted: ``TypeError``)."""

    def __init__(self, tokens: _I32, accept: _F64, lengths: _I32, source: _I8, match_len: _I32) -> None:
        """Hold ``tokens`` int32 [B, K], ``accept`` float64 [B, K], ``lengths`` int32 [B], ``source`` int8 [B] and
        ``match_len`` int32 [B] (a DraftBatch's arrays, B rows, K the drafter's max_spec_tokens); ``TypeError`` for an
        array of another dtype, not C-contiguous or read-only."""

class Drafter:
    """The native DAS drafter: requests in integer slots, five draft sources (problem history, running siblings,
    the request's own text, the running batch, global history), evidence-weighted and calibrated arbitration, one
    batched call per engine step. History automata are built on native threads and swapped in when ready.

    Source ids in the ``source`` outputs index ``das_trl.drafter.sources.SOURCE_ORDER``
    (``problem, siblings, local, batch, global``); ``-1`` means no draft.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        """Create a drafter.

        Args:
            config: ``DrafterConfig`` fields by their Python names (``max_tree_depth``, ``match_context_tokens``,
                ``max_spec_tokens`` (K, 1..``MAX_SPEC_TOKENS``), ``max_spec_factor``, ``max_spec_offset``,
                ``min_token_prob``, ``min_match_len``, ``use_problem_tree``, ``use_global_tree``, ``use_local_tree``,
                ``share_running_siblings``, ``share_running_batch``, ``prompt_tail_tokens``, ``live_token_budget``
                (tokens), ``support_ngram``, ``evidence_pseudocount``, ``match_len_pseudocount``,
                ``truncate_by_evidence``, ``calibrate_acceptance``, ``calibration_pseudocount``,
                ``calibration_step_decay``, ``builder_threads``, ``draft_threads``, ``background_ingest`` (steps in
                which no row drafts leave their new tokens to the drafter's ingest thread; drafts, counters and
                stats equal the synchronous path's), ``defer_idle_rows`` (with it, drafting steps leave the rows
                without a budget to the thread too), ``defer_shared_ingest`` (drafting steps also leave the
                shared automata named by ``late_shared_groups`` -- 1 siblings, 2 batch, 3 both; default 2 -- to
                catch up with the drafting rows' tokens on the thread: drafts read them one step late)); missing
                keys keep the core's defaults.

        Raises:
            ValueError: a field out of range.
        """

    def start(self, slot: int, prompt: _I32, problem: int) -> None:
        """Start request ``slot`` with its prompt tokens (``int32[n]``) under problem key ``problem`` (uint64)."""

    def extend(self, slot: int, tokens: _I32) -> None:
        """Append generated tokens (``int32[n]``) to request ``slot``. Raises ``KeyError`` for an unknown slot."""

    def stop(self, slot: int) -> None:
        """End request ``slot`` (its output stays available to running siblings until released)."""

    def active(self, slot: int) -> bool:
        """Whether ``slot`` holds a running request."""

    def problem_of(self, slot: int) -> int:
        """The problem key of request ``slot``. Raises ``KeyError`` for an unknown slot."""

    def propose(self, slots: _I32, budgets: _I32, tokens: _I32, accept: _F64, lengths: _I32, source: _I8,
                match_len: _I32, fill_idle: int = 1) -> None:
        """Draft for ``n`` active requests at once (GIL released).

        Args:
            slots: ``int32[n]`` request slots.
            budgets: ``int32[n]`` most draft tokens per row (``<= 0``: no draft).
            tokens: out, ``int32[n, K]`` draft tokens (row i valid up to ``lengths[i]``).
            accept: out, ``float64[n, K]`` estimated acceptance probability of each draft position.
            lengths: out, ``int32[n]`` draft lengths.
            source: out, ``int8[n]`` winning source id (``-1``: none).
            match_len: out, ``int32[n]`` context tokens matched by the winning source.
            fill_idle: how the ``tokens``/``accept`` rows of rows that do not draft are zeroed: 0 not at all
                (buffers that are zero already), 1 whole, 2 only their first ``lengths[i]`` entries (buffers that
                hold an earlier call's outputs, each row zero past its length: a few bytes per idle row instead of
                12 K bytes); a drafting row is written whole (zeros past its length; with 2, up to its previous
                length).

        Raises:
            ValueError: a row count differs from ``n`` or ``tokens``/``accept`` do not have K columns.
            KeyError: an inactive slot.
        """

    def step(self, matrix: _I32, slots: _I32, rows: _I32, num_tokens: _I32, num_prompt: _I32, num_sampled: _I32,
             num_verified: _I32, budgets: _I32, tokens: _I32, accept: _F64, lengths: _I32, source: _I8,
             match_len: _I32, fill_idle: int = 1, release: bool = True) -> None:
        """One engine step for ``n`` rows, reading each row's text from the engine's token matrix (GIL released).

        Row i is request ``slots[i]``, whose text is ``matrix[rows[i], :num_tokens[i]]`` (``int32[R, L]``, vLLM's
        ``token_ids_cpu``) with a prompt of ``num_prompt[i]`` tokens and ``num_sampled[i]`` tokens gained this step.
        The verification of the row's previous draft is recorded (accepted = ``min(verified, num_sampled - 1)``,
        verified = its draft length, capped by ``num_verified[i]`` when ``>= 0``), the new output tokens are
        appended (a request whose output shrank is restarted: preemption), then the row is drafted with
        ``budgets[i]``. Outputs (and ``fill_idle``) as in :meth:`propose`. When no row has a budget > 0 and
        ``background_ingest`` is on, the new tokens are copied and queued for the ingest thread, and the call
        returns without touching the automata or waiting for earlier steps' queued tokens; with ``defer_idle_rows``
        a drafting step leaves the rows without a budget to the thread too (ingesting only the drafting rows' tokens
        before it drafts), with ``defer_shared_ingest`` also the late shared automata's catch-up with the drafting
        rows' tokens. A drafting step first completes everything queued before it. ``release=False``: the deferred tokens are
        queued but not offered to the thread until :meth:`release_ingest` (so a :meth:`trim` right after the step
        never waits for that ingest); a call that needs the state completes them anyway.

        Raises:
            ValueError: a row count differs from ``n``, ``tokens``/``accept`` do not have K columns, or
                ``fill_idle`` is not 0, 1 or 2.
            KeyError: an inactive slot.
        """

    def step_into(self, matrix: _I32, slots: _I32, rows: _I32, num_tokens: _I32, num_prompt: _I32,
                  num_sampled: _I32, num_verified: _I32, budgets: _I32, out: StepOutputs, fill_idle: int = 1,
                  release: bool = True) -> None:
        """:meth:`step` writing into ``out``'s arrays (the same checks and results)."""

    def flush(self) -> None:
        """Complete any deferred ingest now (benchmarks, tests; every method that needs it does it itself)."""

    def hold_ingest(self, hold: bool) -> None:
        """Tests: while held, the ingest thread takes no work, so the next call that needs the state completes each
        deferred step itself."""

    def set_ingest_delay(self, us: int) -> None:
        """Tests: the ingest thread sleeps ``us`` microseconds before each queued row while it holds the drafter's
        lock (as while it ingests), so that steps arrive during an ingest; 0: off."""

    def ingest_queued_tokens(self) -> int:
        """Tokens (and started prompts' tokens) queued for the ingest thread now; completes nothing (tests)."""

    def release_ingest(self) -> None:
        """Offer the tokens a ``step(..., release=False)`` deferred to the ingest thread (nothing when none)."""

    def trim(self, slots: _I32, lengths: _I32) -> None:
        """Cut each row's outstanding draft to ``lengths[i]`` tokens (what was really sent for verification);
        touches no automaton, so it does not wait for a deferred ingest."""

    def record_acceptance(self, slot: int, accepted: int, verified: int = -1) -> None:
        """Report that ``accepted`` of the ``verified`` tokens (``-1``: the whole outstanding draft) of ``slot``'s
        last draft were accepted; feeds the acceptance calibration."""

    def release_finished(self, problems: list[int]) -> None:
        """Drop the finished outputs kept for running siblings of these problem keys (their history arrived)."""

    def new_step(self) -> None:
        """Mark a history push (once per training step): decays the acceptance calibration's counts by
        ``calibration_step_decay``."""

    def reset_requests(self) -> None:
        """Forget every running request (history kept)."""

    def submit_history(self, key: int, tokens: _I32, offsets: _I64, weights: _I32) -> None:
        """Replace problem ``key``'s history with these sequences; the automaton is built on a native thread.

        Args:
            key: problem key (uint64).
            tokens: ``int32[T]`` all sequences concatenated.
            offsets: ``int64[S + 1]`` sequence boundaries, from 0 to ``T``, non-decreasing.
            weights: ``int32[S]`` multiplicity of each sequence (``>= 1``).

        Raises:
            ValueError: offsets that do not start at 0 and end at ``T``, decrease, or a weight below 1.
        """

    def drop_history(self, key: int) -> None:
        """Remove problem ``key``'s history (asynchronously, like :meth:`submit_history`)."""

    def wait_history(self, timeout: float = -1.0) -> bool:
        """Wait until submitted history builds are in place (``timeout`` seconds, ``< 0``: no limit; GIL released).

        Returns:
            True if nothing is pending any more.
        """

    def clear_history(self) -> None:
        """Drop all history (problem and global automata); GIL released."""

    def stats(self) -> dict[str, Any]:
        """Counters and memory figures: ``proposals``, ``drafts``, ``draft_tokens``, ``requests``,
        ``verified_drafts``, ``accepted_tokens``, ``wins`` (list per source), ``calibration_tokens``, live pool
        (``active_requests``, ``sibling_groups``, ``lingering_finished``, ``live_*`` tokens and bytes), history
        index (``index_problems``, ``index_tokens``, ``index_sequences``, ``index_states``, ``index_bytes``,
        ``global_tokens``, ``global_bytes``), history builds (``pending_updates``, ``update_builds``,
        ``update_errors``, ``update_seconds``), and deferred ingest (``deferred_steps``, ``caller_ingests``,
        ``ingest_waits``, ``ingest_background_seconds``, ``ingest_last_seconds``, ``ingest_queued_tokens``)."""

    def acceptance_totals(self) -> tuple[int, int, int]:
        """``(verified_drafts, verified_tokens, accepted_tokens)`` since creation."""

    def calibration_ratio(self, source: int, bucket: int, position: int, bin: int) -> float:
        """The acceptance calibration's ratio applied to a conditional prior of a source, match-length bucket (0-4),
        draft-position bucket (0-6: positions 1, 2, 3-4, 5-8, 9-16, 17-32, 33+) and bin (0-9): the cell's
        observed/estimated ratio shrunk towards its (source, position bucket) parent's. ``ValueError`` out of
        range."""

    def check(self) -> str:
        """Integrity check of every automaton and request (for tests): ``""`` when consistent, else a description
        of the first problem found."""

class RequestBook:
    """Per-request records of ``das_trl.vllm.speculator.Speculator`` by slot (problem key, rounds, max output, draft
    tokens sent and their expected acceptance, the fading accepted / rejected record and the fading record of
    speculated steps that sent a draft) and the bookkeeping of one
    engine step around the controller's plan and cut, equal bit for bit to the numpy reference
    ``das_trl.vllm.request_book.RequestBook`` (see ``src/request_book.h``). Use it through
    ``das_trl.vllm.request_book.NativeRequestBook``. Not thread-safe."""

    global_hits: float
    global_misses: float
    global_speculated: float
    global_sent_steps: float

    def __init__(self) -> None:
        """An empty book (prior 0.5 over 2 pseudo-rounds until :meth:`set_prior`)."""

    def set_prior(self, prior: float, prior_rounds: float, send_rounds: float = 0.0) -> None:
        """The gate's acceptance prior in ``[0, 1)`` and its weight in pseudo-rounds; the weight (pseudo-steps) of
        the engine-wide send rate in a request's (0: every row's send rate is 1)."""

    def reset(self, slot: int, key: int, max_output: int, dslot: int) -> None:
        """A new request in ``slot`` (the book grows to hold it): problem key, max output tokens, drafter slot."""

    def begin(self, slots: _I64, steps: int = 1) -> bool:
        """Every row's round count + ``steps``; whether any row had a draft sent last step. Unknown slot or
        ``steps < 1``: ``ValueError``."""

    def distinct(self, slots: _I64) -> bool:
        """Whether the ``slots`` are pairwise distinct (no request twice in a step). Unknown slot: ``ValueError``."""

    def decay(self, steps: int = 1) -> None:
        """``steps`` steps that skipped the plan: the engine-wide record fades (x 0.99 per step)."""

    def prepare(self, slots: _I64, num_sampled: _I32, verified: _I32, num_tokens: _I32, num_prompt: _I32,
                max_model_len: int, k: int, key: _I64, out_len: _I32, rounds: _I64, max_output: _I64, caps: _I32,
                q: _F64, send: _F64) -> tuple[int, int, int, float]:
        """Last step's verification (rows with a draft sent), then the plan's inputs for the ``n`` rows written to
        the seven output arrays (``send``: the chance a speculated draft of the row survives the cut). Returns ``(verified drafts, accepted tokens, verified tokens, expected accepted
        tokens)``."""

    def finish(self, slots: _I64, planned: _B, drafting: _I64, kept: _I32, expected_kept: _F64, tokens: _I32,
               accept: _F64, lengths: _I32, source: _I8, match_len: _I32, drafter: Drafter | None) -> tuple[int, int]:
        """After the drafter's step and the cut: planned rows without a draft count as rejections, the ``m``
        drafting rows (row indices) are cut to ``kept`` in the ``[n, K]`` output in place and in ``drafter`` (its
        trim; ``None``: not told), and what was sent (and whether each planned row sent anything) is recorded. Releases the GIL. Returns ``(drafts, draft
        tokens)`` sent."""

    def ints(self, which: int) -> list[int]:
        """A copy of an integer record per slot: 0 key, 1 rounds, 2 max output, 3 sent, 4 drafter slot."""

    def doubles(self, which: int) -> list[float]:
        """A copy of a float record per slot: 0 expected acceptance of the tokens sent, 1 hits, 2 misses, 3 speculated
        steps, 4 of those that sent a draft (both fading)."""

    def bytes(self) -> int:
        """Bytes held (records and scratch buffers)."""

    def size(self) -> int:
        """Slots held."""


def selftest_containers(seed: int, n: int) -> str:
    """Self-check of the automata's containers against the C++ standard library: ``n`` random inserts, updates and
    lookups of a hash table (incremental doubling, mapped tables from 1 MiB on) and ``n`` appends to the growing
    array (mremap growth from 1 MiB on). Returns ``""`` when all agree, else what differs. Raises ``ValueError`` for
    ``n > 2**27`` (about 4 GB). For the tests; GIL released."""

def selftest_snapshot_layout(seed: int, n: int) -> tuple[str, float]:
    """Self-check of a history snapshot's memory layout: builds one over ``n`` random sequences (1-4096) that repeat
    each other's stretches and checks that the root is state 0, suffix links point to shorter states, and every
    state's most frequent continuation is the next state or one laid out before it (the chain layout a draft's walk
    reads in order). Returns ``("", share)`` when it holds (``share``: states whose continuation is the next state,
    among those with one), else ``(what differs, share)``. Raises ``ValueError`` for ``n`` outside [1, 4096]. For
    the tests."""


def controller_budgets(accept: _F64, table: _F64, pooled: _F64, generated: _F64, cap: _F64, tau_obs: _F64,
                       draws: _F64, params: dict[str, Any], lengths: _I32, value: _F64, p: _F64,
                       expected_kept: _F64, rem_mean: _F64) -> float:
    """Per-row draft budgets of one engine step: the native kernel of the budget controller's Monte Carlo-to-argmin
    block (``BudgetController.budgets``; same draws, same budgets as the numpy path). GIL released.

    Args:
        accept: ``float64[n, k]`` acceptance probability of each draft position.
        table: ``float64[n, w]`` each row's problem's recent lengths, ascending (padding below any length first).
        pooled: ``float64[m]`` all recent lengths, ascending.
        generated: ``float64[n]`` tokens generated so far.
        cap: ``float64[n]`` most tokens still allowed (``+inf``: none).
        tau_obs: ``float64[n]`` observed tokens per round.
        draws: ``float64[4, n, s]`` uniforms in [0, 1) (index, mixture, tail, jitter), or ``[4, 1, s]``: the same
            draws for every row (the stratified ones).
        params: ``ratio``, ``tail_prior_weight``, ``c_base_ms``, ``c_tok_ms``, ``draft_margin``, ``pooled_weight``,
            ``length_jitter``, ``extrapolation_fraction``, ``min_remaining``, ``bins`` (missing: defaults).
        lengths: out, ``int32[n]`` kept draft tokens.
        value: out, ``float64[n]`` ms per token of progress at that length.
        p: out, ``float64[n]`` probability of finishing last (shrunk).
        expected_kept: out, ``float64[n]`` sum of acceptance x survival over the kept positions.
        rem_mean: out, ``float64[n]`` mean sampled remaining tokens.

    Returns:
        The expected makespan in rounds.

    Raises:
        ValueError: a row count differs from ``n``, ``draws`` is not ``[4, n, s]`` or ``[4, 1, s]``, an empty table or
            sample axis, or ``bins < 1``.
    """

def controller_cut(accept: _F64, table: _F64, pooled: _F64, rows: _I64, generated: _F64, cap: _F64, draws: _F64,
                   weight: _F64, params: dict[str, Any], lengths: _I32, value: _F64,
                   expected_kept: _F64) -> tuple[int, int, int, float]:
    """The cut of a planned step (``BudgetController.cut``) for its ``m`` drafted rows: survival from the remaining
    length samples, then the draft length minimising the cost per token of progress under each row's weight
    (``c_base * P_i`` from the plan over the whole batch), and the step's counters. GIL released.

    Args:
        accept: ``float64[m, k]`` cumulative acceptance estimates of each drafted row (checked: in ``[0, 1]``).
        table / pooled / draws: as :func:`controller_budgets`, for these ``m`` rows (``draws`` ``[4, m, s]`` or
            ``[4, 1, s]``).
        rows: ``int64[m]`` the drafted rows' indices in the plan's ``n`` rows.
        generated: ``float64[n]`` the plan's tokens generated so far (all rows).
        cap: ``float64[n]`` the plan's most tokens still allowed (``[0]``: no cap).
        weight: ``float64[n]`` the plan's ``c_base * P_i`` (ms one more round of the row adds to the batch's cost).
        params: ``ratio``, ``c_tok_ms``, ``draft_margin``, ``pooled_weight``, ``length_jitter``,
            ``extrapolation_fraction``, ``min_remaining`` (missing: defaults).
        lengths: out, ``int32[m]`` kept draft tokens.
        value: out, ``float64[m]`` ms per token of progress at that length.
        expected_kept: out, ``float64[m]`` sum of acceptance x survival over the kept positions.

    Returns:
        ``(kept tokens, rows keeping >= 1 token, offered tokens (estimates > 0), sum of expected_kept)``.

    Raises:
        ValueError: a row count differs from ``m`` / ``n``, a row outside the plan, an estimate outside ``[0, 1]`` or
            NaN (nothing written), bad ``draws``, an empty table or sample axis.
    """


def controller_rows_seen(slots: _I64, slot_epoch: _I64, epoch: int) -> bool:
    """Whether every row was seen by the plan of epoch ``epoch``: each of ``slots`` (``int64 [n]``) lies in
    ``[0, len(slot_epoch))`` with ``slot_epoch[slot] >= epoch`` (``slot_epoch``: ``int64 [m]``). The check of
    ``BudgetController.quiet_step`` in one pass; ``True`` for no rows."""

def controller_scratch_bytes() -> int:
    """Bytes of the controller kernels' scratch arrays, all threads together: each thread that called a kernel keeps
    its own (``[n, s]`` samples and ``[n, bins]`` histograms, ~1.2 MB at 1,024 rows), sized by the largest batch it
    planned, until it exits (allocated per call, they were given back to the system and faulted in again each call)."""

def controller_plan(out_len: _F64, rounds: _F64, max_output: _F64, caps: _I32, q: _F64, replan: bool, table: _F64,
                    pooled: _F64, draws: _F64, slots: _I64, slot_p: _F64, slot_epoch: _I64, epoch: int,
                    tau_z: _F64, send: _F64, params: dict[str, Any], draft: _B, weight: _F64, p: _F64,
                    rem_mean: _F64, budget: _I32) -> tuple[float, int, int]:
    """``BudgetController.plan`` after its replan decision, in one call: the tail probabilities (recomputed with
    ``replan``, else each request's stored one renormalised over the batch), the prior shrink, each row's weight
    ``c_base * P_i`` and the gate (``gate_rows``: rows whose predicted acceptance can pay for their verification and
    for ``draft_row_ms`` of proposer CPU). GIL released.

    Args:
        out_len: ``float64[n]`` tokens generated so far.
        rounds: ``float64[n]`` verification rounds so far (``[0]``: 1 token per round).
        max_output: ``float64[n]`` each request's max tokens (``[0]``: no cap).
        caps: ``int32[n]`` hard draft caps (0: never drafted).
        q: ``float64[n]`` predicted per-token acceptance.
        replan: recompute the tail probabilities (``table`` / ``pooled`` / ``draws`` as :func:`controller_budgets`
            are read only then).
        slots: ``int64[n]`` each request's slot in ``slot_p`` / ``slot_epoch`` (``[0]``: none; then ``replan`` is
            required).
        slot_p / slot_epoch: in/out, ``float64[S]`` / ``int64[S]`` each slot's stored probability and the epoch it was
            computed in (written with ``replan``, as ``epoch``).
        tau_z: ``float64[samples]`` standard normal quantiles, one per sample: each sample's tokens per round is
            then uncertain (``params["tau_uncertainty"]``; ``das_trl.budget.remaining.tau_samples``); ``[0]``:
            exact.
        send: ``float64[n]`` each row's chance that its draft survives the cut (the gate charges ``draft_row_ms /
            max(send, 0.05)``); ``[0]``: 1.
        params: as :func:`controller_budgets` plus ``draft_row_ms`` and ``tau_uncertainty`` (missing: defaults).
        draft: out, ``bool[n]`` rows to draft.
        weight: out, ``float64[n]`` ``c_base * P_i`` (ms).
        p: out, ``float64[n]`` probability of finishing last (shrunk).
        rem_mean: out, ``float64[n]`` mean sampled remaining tokens (written only with ``replan``).
        budget: out, ``int32[n]`` most draft tokens per drafted row (``das_trl.budget.gate.draft_caps``; 0 for
            rows not drafted); ``params["ratio"]`` is the controller's acceptance correction it allows for.

    Returns:
        ``(expected makespan in rounds or nan without replan, rows drafted, rows with P >= 0.5)``.

    Raises:
        ValueError: a row count differs from ``n``, a slot outside ``slot_p``, ``slot_p`` and ``slot_epoch`` of
            different lengths, no slots without ``replan``, or (with ``replan``) bad ``table`` / ``draws``.
    """

"""Configuration of the DAS drafter (history window, suffix trees, arbitration)."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass, field

#: Approximate RAM per token held by one live tree of the reference drafter (arctic suffix-tree nodes plus the n-gram
#: support dicts), in bytes; the native core measures its own (``live_approx_bytes`` in its stats). Measured with
#: random tokens (no shared paths: the worst case) by tests/test_reliability_memory.py's live-pool input: see
#: docs/reliability.md. The reference's ``stats()["live_approx_bytes"]`` is this times ``live_tree_tokens``.
LIVE_TREE_BYTES_PER_TOKEN = 400

#: RAM per finished token the native core's live pool holds at most, in bytes: the token sits in the sibling and the
#: batch automaton (random tokens, the worst case: 428-441 B of RSS per finished token held,
#: ``python -m das_trl.bench.micro.live_memory``; docs/reliability.md). The pages' "about 0.43 KB per token, 0.9 GB
#: at the default 2M" and ``das-trl doctor`` use it.
NATIVE_LIVE_BYTES_PER_FINISHED_TOKEN = 430

#: The default hard cap K of draft tokens per request per round: the drafter's ``max_spec_tokens``, the engine's
#: ``num_speculative_tokens`` (``das_trl.vllm.engine``) and the trainer's ``das_num_speculative_tokens``.
DEFAULT_MAX_SPEC_TOKENS = 64

#: The deepest suffix tree the native core builds (its DrafterConfig::validate; the reference backend has no limit).
NATIVE_MAX_TREE_DEPTH = 4096

#: Bound on ``|max_spec_factor|`` and ``|max_spec_offset|`` (draft tokens per matched token / draft tokens).
_SPEC_LIMIT = 1e4


@dataclass
class DrafterConfig:
    """Settings of the DAS drafter (either backend, :func:`~das_trl.drafter.create_drafter`); validated on construction
    (``ValueError`` naming the field: wrong type, including a non-bool for a switch, non-finite or out of range).
    Limits of the native core itself (``max_tree_depth`` <= :data:`NATIVE_MAX_TREE_DEPTH`, ``max_spec_tokens`` <= 64) are checked by
    :func:`~das_trl.drafter.create_drafter`, since the reference backend has none.

    History (DAS paper, Sec. "rollout history": per-problem sliding window):
        window: appearances of a problem kept (one appearance = the group of
            completions a problem got in one ``add_rollouts`` call, i.e. one GRPO step).
        history_token_budget: total completion tokens kept across all problems; when
            exceeded, whole appearances are evicted oldest-first across problems. The native
            core holds about 0.1-0.17 KB of RAM per history token at the default tree depth
            (measured on recorded rollouts, docs/tuning.md), so the default 8M tokens is about
            1.3 GiB at most (the reference's trees took 0.55-1 KB per token at depth 32).
        recent_appearance_weight: the newest appearance of each problem counts this many
            times in its problem tree (older ones once), so the tree's probabilities lean
            towards the current policy (the paper down-weights older epochs). 1 = equal
            weights; each extra unit re-inserts the newest appearance once more.
        prompt_tail_tokens: last prompt tokens prepended to every history/sibling
            sequence inside the trees, so the first output tokens (context = prompt
            tail) can be drafted. Not counted in the token budget.

    Speculation (arctic-inference ``SuffixTree.speculate`` parameters):
        max_tree_depth: suffix-tree depth. A tree path holds the matched context and the
            draft together, so a draft after an m-token match is at most depth - m long.
        match_context_tokens: the context tail matched against the trees (<= max_tree_depth;
            ``None``: min(32, max_tree_depth)). arctic's ``speculate`` costs O(this).
        max_spec_tokens: hard cap of draft tokens per request per round.
        max_spec_factor: draft length <= factor * match length + offset (as arctic); in (0, 1e4].
        max_spec_offset: see ``max_spec_factor``; in [-1e4, 1e4].
        min_token_prob: a chain draft stops at the first token whose estimated acceptance
            probability (evidence-adjusted, calibrated) is below this; arctic also drops
            tree continuations whose raw probability is below it. Defaults (K 64, factor 2.0,
            0.1, ``max_tree_depth`` 64) chosen by the replay suite on every recorded set, with the
            position-aware calibration on; the budget controller then keeps, per row, the part of
            each draft that pays (benchmarks/NOTES.md).
        min_match_len: candidates matching fewer context tokens are discarded.

    Sources (each can be switched off):
        use_problem_tree: per-problem tree over the problem's windowed history.
        use_global_tree: one tree over all history completions (fallback for problems
            without history, e.g. the first epoch).
        global_samples_per_appearance: only the first this-many completions of each
            appearance enter the global tree (0 = all). The global tree is for patterns
            shared across problems; it does not need every sibling, and it is the
            largest tree, so this bounds the main cost of ``add_rollouts``.
        use_local_tree: per-request tree over its prompt and its own output so far.
        share_running_siblings: running (and finished, not yet pushed) siblings of
            the same problem see each other's outputs.
        share_running_batch: one more live tree over the outputs of every running (and
            finished, not yet pushed) request, across problems (as vLLM's ``suffix`` method
            shares active responses): format and phrasing repeat across problems.
        live_token_budget: bound, in tokens, on the finished sibling/batch outputs kept
            visible until the next ``add_rollouts`` of their problem replaces them. A finished
            output holds its prompt tail + output tokens; when, after a request stops, the
            finished outputs hold more than this, the oldest (stop order) are dropped until they
            hold at most half of it (``reference/live.py``: exact rule). Running requests are never evicted. It
            keeps an engine that never receives ``add_rollouts`` (evaluation, a trainer that pushes rarely)
            bounded: a finished output sits in the sibling and the batch automaton, about 0.43 KB
            of RAM per token with random tokens in the native core (docs/reliability.md), so the
            default 2M tokens is about 0.9 GB at most. 2M tokens hold one whole step of 256 rollouts of 8k
            tokens; past that the newest outputs (the ones siblings still running are closest
            to) are the ones kept. 0 = finished outputs are dropped at once (replaces the
            former count cap ``max_lingering_finished``).

    Evidence-weighted arbitration (see ``reference/arbitration.py``):
        support_ngram: n-gram order g used to count supporting sequences: a candidate
            is supported by the sequences containing (last g-1 context tokens, first
            draft token).
        evidence_pseudocount: kappa in conf = n / (n + kappa); n supporting sequences.
        match_len_pseudocount: mu in match_conf = m / (m + mu); m = match length.
        truncate_by_evidence: cut a draft where the evidence-adjusted probability a_i
            falls below ``min_token_prob`` (True), or where the raw tree probability does
            (False, arctic's rule; the evidence then only picks the source).
        support_table_bits: log2 of the counter-table width used to count support in
            history (2 rows of int32: 8 * 2**bits bytes; 23 -> 64 MiB).

    Implementation:
        backend: ``"native"`` (the C++ core behind ``drafter.py``: one call per engine step, history built on
            native threads), ``"python"`` (the pure-Python reference, ``reference/``; needs arctic-inference, the
            ``reference`` extra), or ``"auto"`` (native when built, else python with a warning). Both draft the
            same tokens up to ties between equally frequent continuations (docs/architecture.md).
        builder_threads: native threads building history automata (``native`` backend; 1-64; default: one fewer
            than the CPU cores, at most 4, so the engine thread keeps a core).
        draft_threads: threads that draft the rows of one engine step in parallel (``native`` backend; the
            calling thread included; 1-64; default: half the CPU cores, at most 8: 1 on a 2-core machine, where
            a second thread only competes with the engine's). In a step with at least 4 drafting rows they also
            append those rows' new tokens, one automaton per task (each row's own, each sibling group's, the
            batch's). vLLM runs the drafter synchronously, so a GPU engine's CPU threads are idle meanwhile;
            drafts are the same for any value.
        background_ingest: in an engine step where no row drafts (every budget <= 0), copy the rows' new tokens
            into a queue and append them to the request, sibling and batch automata on a native thread while the
            engine runs its forward pass, instead of before ``step`` returns (``native`` backend; the reference
            ignores it); a started request's prompt is queued the same way. Such a step does not wait for what
            earlier steps queued. Any call that needs the automata (a drafting step, ``propose_batch``,
            ``extend_request``, ``stop_request``, ``record_acceptance``, ``stats``, ``check``, ``add_rollouts``)
            completes the queue first, so drafts, counters and stats are the same either way. False: every step
            (and ``start_request``) ingests before it returns.
        defer_idle_rows: with ``background_ingest``, a step in which some rows draft also leaves the new tokens of
            the rows without a budget to the ingest thread, as well as the prompts of requests started since the last
            step that do not draft in it; before it drafts it ingests only the drafting rows' tokens and prompts
            (``native`` backend). A drafting row's own text is always up to date; the sibling and batch
            automata get the other rows' newest tokens one step later, so drafts differ slightly from the
            synchronous path's (deterministically: the same inputs give the same drafts). Measured by replay: a
            step drafting a few rows of a large batch cost as much as every row's ingest (benchmarks/NOTES.md,
            "steps that draft little cost little"). False: drafting steps ingest every row first (drafts identical
            to ``background_ingest=False``).
        defer_shared_ingest: with ``background_ingest``, a drafting step does before it drafts only what its drafts
            read now: the drafting rows' own text (own automaton, recent tokens, history matches). The idle rows'
            tokens and the sibling and batch automata's catch-up with the drafting rows' tokens go to the ingest
            thread (implies ``defer_idle_rows``): drafts read every row's newest tokens there one step late, while
            a drafting row's own match in them follows its current context (``native`` backend; deterministic).

    Calibration from verification outcomes (``reference/calibration.py``):
        calibrate_acceptance: scale each token's conditional estimate (given the tokens before it) by the
            observed/predicted acceptance ratio of its (source, match-length bucket, draft-position bucket,
            estimate bin) cell, learned from the verified drafts the engine reports through
            ``DASDrafter.record_acceptance``; the draft's estimates are their running products
            (``reference/calibration.py``). Without reports nothing changes.
        calibration_pseudocount: s, pseudo-observations per cell at its (source, position) pooled ratio
            (larger: slower to move away from the pooled correction and the evidence model).
        calibration_step_decay: the calibration counts are multiplied by this at every
            ``add_rollouts`` (one GRPO step), so a source the drafter stopped drafting from
            is tried again after a few steps and the correction follows the policy.
    """

    window: int = 16
    history_token_budget: int = 8_000_000
    recent_appearance_weight: int = 1
    prompt_tail_tokens: int = 32
    max_tree_depth: int = 64
    match_context_tokens: int | None = None
    max_spec_tokens: int = DEFAULT_MAX_SPEC_TOKENS
    max_spec_factor: float = 2.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    min_match_len: int = 1
    use_problem_tree: bool = True
    use_global_tree: bool = True
    global_samples_per_appearance: int = 4
    use_local_tree: bool = True
    share_running_siblings: bool = True
    share_running_batch: bool = True
    live_token_budget: int = 2_000_000
    support_ngram: int = 3
    evidence_pseudocount: float = 2.0
    match_len_pseudocount: float = 1.0
    support_table_bits: int = 23
    truncate_by_evidence: bool = True
    calibrate_acceptance: bool = True
    calibration_pseudocount: float = 8.0
    calibration_step_decay: float = 0.5
    backend: str = "auto"
    builder_threads: int = field(default_factory=lambda: max(1, min(4, (os.cpu_count() or 2) - 1)))
    draft_threads: int = field(default_factory=lambda: max(1, min(8, (os.cpu_count() or 1) // 2)))
    background_ingest: bool = True
    defer_idle_rows: bool = True
    defer_shared_ingest: bool = False

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"DrafterConfig: {msg}")

        if self.match_context_tokens is None and isinstance(self.max_tree_depth, int):
            self.match_context_tokens = min(32, self.max_tree_depth)

        for low, names in ((1, ("window", "history_token_budget", "max_tree_depth", "match_context_tokens",
                                "max_spec_tokens", "min_match_len", "recent_appearance_weight")),
                           (0, ("prompt_tail_tokens", "live_token_budget", "global_samples_per_appearance"))):
            for name in names:
                value = getattr(self, name)
                # the native core holds token budgets in 64 bits and the other counts in 32 (std::bad_cast past them)
                high = 2**62 if name in ("history_token_budget", "live_token_budget") else 2**31 - 1
                need(isinstance(value, int) and not isinstance(value, bool) and low <= value <= high,
                     f"{name} must be an int in [{low}, {high}], got {value!r}")
        for name in ("use_problem_tree", "use_global_tree", "use_local_tree", "share_running_siblings",
                     "share_running_batch", "truncate_by_evidence", "calibrate_acceptance", "background_ingest",
                     "defer_idle_rows", "defer_shared_ingest"):
            value = getattr(self, name)  # "no" would read as True, and the native core cannot take it at all
            need(isinstance(value, bool), f"{name} must be a bool, got {value!r}")
        for name in ("max_spec_factor", "max_spec_offset", "min_token_prob", "evidence_pseudocount",
                     "match_len_pseudocount", "calibration_pseudocount", "calibration_step_decay"):
            value = getattr(self, name)
            try:
                finite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            except OverflowError:  # an int past float's range
                finite = False
            need(finite, f"{name} must be a finite number, got {value!r}")
        # The draft length is capped by max_spec_tokens (at most 64 natively) long before these limits; beyond them
        # factor * match length + offset overflows the core's int conversion and every draft came back empty.
        need(0 < self.max_spec_factor <= _SPEC_LIMIT,
             f"max_spec_factor must be in (0, {_SPEC_LIMIT:g}], got {self.max_spec_factor}")
        need(-_SPEC_LIMIT <= self.max_spec_offset <= _SPEC_LIMIT,
             f"max_spec_offset must be in [-{_SPEC_LIMIT:g}, {_SPEC_LIMIT:g}], got {self.max_spec_offset}")
        need(0.0 <= self.min_token_prob <= 1.0,
             f"min_token_prob must be in [0, 1], got {self.min_token_prob}")
        need(isinstance(self.support_ngram, int) and self.support_ngram >= 2,
             f"support_ngram must be an int >= 2, got {self.support_ngram!r}")
        need(self.match_context_tokens <= self.max_tree_depth,
             f"match_context_tokens ({self.match_context_tokens}) must be <= max_tree_depth ({self.max_tree_depth})")
        need(self.support_ngram <= self.max_tree_depth,
             f"support_ngram ({self.support_ngram}) must be <= max_tree_depth ({self.max_tree_depth})")
        need(self.evidence_pseudocount > 0,
             f"evidence_pseudocount must be > 0, got {self.evidence_pseudocount}")
        need(self.match_len_pseudocount >= 0,
             f"match_len_pseudocount must be >= 0, got {self.match_len_pseudocount}")
        need(0.0 <= self.calibration_step_decay <= 1.0,
             f"calibration_step_decay must be in [0, 1], got {self.calibration_step_decay}")
        need(self.calibration_pseudocount > 0,
             f"calibration_pseudocount must be > 0, got {self.calibration_pseudocount}")
        need(self.backend in ("auto", "native", "python"),
             f"backend must be 'auto', 'native' or 'python', got {self.backend!r}")
        for name in ("builder_threads", "draft_threads"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 64,
                 f"{name} must be an int in [1, 64], got {value!r}")
        need(isinstance(self.support_table_bits, int) and 10 <= self.support_table_bits <= 30,
             f"support_table_bits must be an int in [10, 30], got {self.support_table_bits!r}")

    def to_dict(self) -> dict:
        """Return the fields as a plain ``dict`` (for logs and state files)."""
        return asdict(self)

"""The replay simulation: a recorded epoch replayed as one continuous batch, engine step by engine step.

Hardware-independent; no model runs. The eval epoch's requests all start together. Each engine step, every running
request gets a draft from the drafter (:mod:`das_trl.bench.drafters`), the draft is accepted up to its first mismatch
with the recorded completion, and the request emits accepted + 1 tokens (never past its recorded end). Running
siblings see each other's outputs as of the previous step (the drafter's sibling visibility; arctic's active
responses). A step costs ``t_fwd = c_base + c_tok * tokens_in_pass`` (ms; tokens = running requests + their draft
tokens); the batch drains as requests finish. Warm-up (:func:`simulate`'s ``warmup``): the drafter first serves the
last history epoch the same way, which then becomes history, as in a live run; only the replayed epoch is measured.

**What the engine waits for.** vLLM runs a ``custom_class`` proposer synchronously after every engine step (async
scheduling off), so the proposer's CPU time is added to every step. Each drafter times exactly the calls the live
proposer makes, per engine step, with a :class:`Stopwatch` the simulation hands it (``Drafter.watch``): DAS, the
:class:`~das_trl.vllm.speculator.Speculator`'s ``start`` / ``step`` / ``finish`` (``das+controller``) or the
drafter's own calls (the other variants); ``suffix``, its per-step cache calls; ``none``, nothing. Building the arrays
an engine holds in place (vLLM's ``token_ids_cpu``, ``num_tokens``) is the replay's cost and is not timed. The
clock is the calling thread's CPU time (:data:`cpu_clock`, ``time.thread_time``): this machine is shared and its
wall time is noisy; a drafter with several drafting threads is timed by the wall clock (:data:`wall_clock`), since
thread time would miss the workers. Work the native drafter leaves to its ingest thread in a step where no row
drafts overlaps the engine's forward pass: it is measured per step (``background_seconds``) and only what exceeds
that step's forward time is charged (:meth:`ReplayResult.cpu_ms`).

Time with the CPU (:meth:`ReplayResult.time_with_cpu`)::

    c_base * steps + c_tok * tokens in the forward passes + c_logprob * logprob rows
        + proposer CPU / host_speed (+ async_off_ms * steps, speculative only)

**Verification logprobs** (``c_logprob``, ``verification_shape``; :mod:`das_trl.budget.cost_model`): every step scores
the sampled positions' logprobs (TRL asks for them), one row per verified position where das-trl's patch is installed
(``"patched"``), ``rows x (longest draft + 1)`` on vLLM's own path (``"padded"``). The replay records each step's
rows and longest draft, so one result is priced under either shape (:meth:`ReplayResult.priced`); a drafter whose
drafts depend on the price (``das+controller``) is replayed under each.

**Admission** (:class:`Admission`; off by default: every request starts decoding at step 0 and prompts cost nothing):
requests enter under the engine's token budget with their prompts' prefill, as das-trl's scheduler runs them
(``das_trl.vllm.scheduler.DASScheduler``): each step the budget covers one token per decoding request, then the prompt
chunks of requests still prefilling, then waiting requests in order (chunked prefill, up to ``max_num_seqs`` requests
in the engine; a prompt whose problem was prefilled in an earlier step is a prefix-cache hit but for its last
partial block), and only then drafts, cut far positions first (the drafter is told what was scheduled). A request
emits its first token in the step its prefill completes and is drafted from the next one.

**The profiled verification shape** (:func:`profiled_limits`; off by default): a GPU engine verifies at most as many
draft tokens per step as vLLM's memory profile sampled rows, and, where the logprob path is padded, drafts at most
that / rows tokens per row (``das_trl.vllm.verification_profile``); the default drafter's Speculator enforces them as
the proposer does.

Bounds (:class:`Bounds`): ``oracle-trim`` (``das+siblings``' drafts, made to the hard cap every step, each cut to
exactly its accepted tokens: no waste, no CPU) and ``oracle-text`` (the true continuation at the draft cap K:
each round emits ``min(K + 1, remaining)`` tokens; analytic; no CPU).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from das_trl.bench.drafters import Drafter
from das_trl.budget.cost_model import VERIFICATION_SHAPES, logprob_rows
from das_trl.budget.step_cap import cap_step_tokens
from das_trl.drafter.config import DEFAULT_MAX_SPEC_TOKENS
from das_trl.drafter.rollout_log import RolloutRecord

#: The clock a replay times the proposer's calls with (seconds of this thread's CPU time); tests replace it.
cpu_clock: Callable[[], float] = time.thread_time
#: The clock for drafters with several drafting threads (thread time would miss the workers).
wall_clock: Callable[[], float] = time.perf_counter

#: The default draft cap of the ``oracle-text`` bound (the product's ``das_num_speculative_tokens``).
ORACLE_K = DEFAULT_MAX_SPEC_TOKENS


class Stopwatch:
    """Accumulates the time spent inside ``with watch:`` blocks (seconds, by ``clock``) until :meth:`take`.

    ``background`` accumulates work that overlaps the engine's forward pass (:meth:`add_background`)."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock if clock is not None else cpu_clock
        self.seconds = 0.0
        self.background = 0.0
        self._t0 = 0.0

    def __enter__(self) -> "Stopwatch":
        self._t0 = self.clock()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds += self.clock() - self._t0

    def add_background(self, seconds: float) -> None:
        self.background += max(0.0, float(seconds))

    def take(self) -> tuple[float, float]:
        """``(critical seconds, background seconds)`` since the last take; both restart at 0."""
        out = (self.seconds, self.background)
        self.seconds = self.background = 0.0
        return out


@dataclass(frozen=True)
class Admission:
    """How requests enter a replayed batch (module docstring, "Admission").

    Attributes:
        token_budget: tokens the engine schedules per step, prompt chunks and draft tokens included (vLLM's
            ``max_num_scheduled_tokens``, i.e. ``max_num_batched_tokens``).
        max_num_seqs: most requests in the engine at once (``None``: no limit but the budget).
        prefix_cache: a prompt whose problem was prefilled in an earlier step computes only its last partial block
            (vLLM's automatic prefix caching, on by default; GRPO siblings share their prompt).
        block_size: KV-cache block (tokens) of the prefix cache (vLLM's default 16).

    Raises:
        ValueError: ``token_budget`` or ``max_num_seqs`` below 1 or ``max_num_seqs > token_budget`` (a decoding
            request needs a token every step), ``block_size`` below 1.
    """

    token_budget: int
    max_num_seqs: int | None = None
    prefix_cache: bool = True
    block_size: int = 16

    def __post_init__(self) -> None:
        if int(self.token_budget) < 1 or int(self.block_size) < 1:
            raise ValueError(f"Admission: token_budget and block_size must be >= 1, got {self.token_budget}, "
                             f"{self.block_size}")
        if self.max_num_seqs is not None and not 1 <= int(self.max_num_seqs) <= int(self.token_budget):
            raise ValueError(f"Admission: max_num_seqs must be in [1, token_budget={self.token_budget}] (each decoding "
                             f"request takes a token of the budget every step), got {self.max_num_seqs}")

    @classmethod
    def trainer_default(cls, num_requests: int, k: int = DEFAULT_MAX_SPEC_TOKENS, **kw) -> "Admission":
        """The budget a colocated GPU engine gets from das-trl for ``num_requests`` rows at draft cap ``k``
        (``das_trl.vllm.engine.default_max_num_batched_tokens``: ``rows x (k + 1)`` within 8192..16384), with every
        request of the batch allowed in the engine at once."""
        from das_trl.vllm.engine import default_max_num_batched_tokens

        return cls(default_max_num_batched_tokens(k, num_requests, cpu=False), max(1, num_requests), **kw)

    def verification_limits(self, shape: str, draft_tokens: int | None = None, k: int = DEFAULT_MAX_SPEC_TOKENS):
        """The verification limits of a GPU engine of this size at draft cap ``k`` (:func:`profiled_limits`)."""
        return profiled_limits(self.max_num_seqs or self.token_budget, self.token_budget, shape, draft_tokens, k)

    def cached_prompt(self, prompt_len: int) -> int:
        """Prompt tokens a prefix-cache hit skips: its full blocks but the last token's (vLLM recomputes at least the
        last prompt token)."""
        return (max(prompt_len - 1, 0) // self.block_size) * self.block_size if self.prefix_cache else 0


def profiled_limits(max_num_seqs: int, max_num_batched_tokens: int, shape: str, draft_tokens: int | None = None,
                    num_speculative_tokens: int | None = None):
    """What a GPU engine with these sizes lets one step verify
    (:func:`das_trl.vllm.verification_profile.verification_limits`: ``N = min(max_num_seqs, max_num_batched_tokens)``
    draft tokens per step, at least ``FULL_DRAFTS_PROFILED x num_speculative_tokens`` when that is given, or
    ``draft_tokens`` as ``DAS_TRL_VERIFY_DRAFT_TOKENS`` sets it, and on the padded shape that / ``N`` tokens per
    row): a ``VerificationLimits``."""
    from types import SimpleNamespace

    from das_trl.vllm.verification_profile import ENV_VAR, verification_limits

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=int(max_num_seqs),
                                                              max_num_batched_tokens=int(max_num_batched_tokens)),
                             speculative_config=SimpleNamespace(num_speculative_tokens=num_speculative_tokens))
    return verification_limits(config, shape, cpu=False, environ={} if draft_tokens is None else
                               {ENV_VAR: str(int(draft_tokens))})


@dataclass
class ReplayResult:
    """One drafter's replay of one batch. Counts are tokens, requests, rounds (one verification round = one request
    in one forward pass) and engine steps; ``sim_time_ms`` is the cost-model time (ms) without the CPU, priced as the
    replay ran; per step: ``step_tokens`` (tokens in its forward pass, prompt chunks included), ``step_rows``
    (requests whose logits it scores: decoding and prefilling), ``step_drafts`` / ``step_longest`` (draft tokens
    verified, and the longest draft), ``proposer_seconds`` (the proposer's calls on the critical path) and
    ``background_seconds`` (its ingest overlapping the forward pass). ``logprob_ms`` / ``verification_shape``: the
    price of the logprob rows :meth:`time_at` charges (:meth:`priced` re-prices). With admission: ``prefill_tokens``
    (prompt tokens computed), ``first_token_steps`` (per request, the step of its first token, 1-based) and
    ``admission`` (the settings). Measured times vary from run to run."""

    name: str
    requests: int
    tokens: int
    rounds: int                      # request-rounds (forward passes summed over requests)
    draft_tokens: int
    accepted_tokens: int
    steps: int                       # engine steps until the batch drained (= tail forward passes)
    sim_time_ms: float
    passes: list[int] = field(repr=False, default_factory=list)    # per request
    lengths: list[int] = field(repr=False, default_factory=list)   # per request
    batch_trace: list[tuple[float, int]] = field(repr=False, default_factory=list)  # (t_ms at step start, running)
    drafter_seconds: float = 0.0     # sum of proposer_seconds
    step_tokens: list[int] = field(repr=False, default_factory=list)
    proposer_seconds: list[float] = field(repr=False, default_factory=list)
    background_seconds: list[float] = field(repr=False, default_factory=list)
    speculative: bool = True         # pays the async-scheduling charge (every method but ``none``)
    cpu_clock: str = "thread"        # "thread" (CPU time of the calling thread), "wall" or "none"
    cpu_representative: bool = True  # False: the replay's implementation is not what the engine runs (ngram)
    counters: dict = field(repr=False, default_factory=dict)  # drafter-specific (the Speculator's counters)
    reliability: dict = field(repr=False, default_factory=dict)  # das_trl.bench.reliability summary (controller)
    step_rows: list[int] = field(repr=False, default_factory=list)
    step_drafts: list[int] = field(repr=False, default_factory=list)
    step_longest: list[int] = field(repr=False, default_factory=list)
    logprob_ms: float = 0.0
    verification_shape: str = "patched"
    prefill_tokens: int = 0
    first_token_steps: list[int] = field(repr=False, default_factory=list)
    admission: dict | None = None

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / max(1, self.rounds)

    @property
    def draft_per_accepted(self) -> float:
        return self.draft_tokens / self.accepted_tokens if self.accepted_tokens else math.nan

    @property
    def forward_tokens(self) -> int:
        """Tokens in all forward passes: one per request-round plus the draft tokens, plus prompt chunks with
        admission."""
        return int(np.sum(self.step_tokens)) if self.step_tokens else self.rounds + self.draft_tokens

    def logprob_rows(self, shape: str | None = None) -> int:
        """Rows of the verification logprob path over the batch under ``shape`` (``None``: the result's own):
        ``rows + draft tokens`` per step (patched), ``rows x (longest + 1)`` (padded)."""
        shape = self.verification_shape if shape is None else shape
        if not self.step_rows:  # a result without per-step rows (built by hand): every verified token once
            return int(logprob_rows(shape, self.rounds, self.rounds + self.draft_tokens, 0))
        rows = np.asarray(self.step_rows, np.int64)
        return int(np.sum(logprob_rows(shape, rows, rows + np.asarray(self.step_drafts, np.int64),
                                       np.asarray(self.step_longest, np.int64))))

    def priced(self, logprob_ms: float, verification_shape: str) -> "ReplayResult":
        """This result with its logprob rows priced at ``logprob_ms`` per row under ``verification_shape`` (a copy;
        the drafts are not replayed: exact for drafters whose drafts do not depend on the price)."""
        if verification_shape not in VERIFICATION_SHAPES:
            raise ValueError(f"verification_shape must be one of {VERIFICATION_SHAPES}, got {verification_shape!r}")
        return dataclasses.replace(self, logprob_ms=float(logprob_ms), verification_shape=verification_shape)

    def time_at(self, c_base: float, c_tok: float) -> float:
        """Cost-model time (ms) without the CPU under another cost model: every step costs ``c_base``, every token
        of a forward pass (one per request-round plus the draft tokens, plus prompt chunks with admission)
        ``c_tok``, and every logprob row (:meth:`logprob_rows`) the result's ``logprob_ms``. Exact for drafters
        whose drafts do not depend on the cost model (all but ``das+cost`` and ``das+controller``)."""
        lp = self.logprob_ms * self.logprob_rows() if self.logprob_ms else 0.0
        return c_base * self.steps + c_tok * self.forward_tokens + lp

    def cpu_ms(self, c_base: float, c_tok: float, host_speed: float = 1.0) -> float:
        """The proposer's time on the critical path (ms): its calls' time / ``host_speed``, plus, per step, the
        background ingest beyond that step's forward pass (:meth:`background_excess_ms`)."""
        if not self.proposer_seconds:
            return 0.0
        crit = 1000.0 * float(np.sum(self.proposer_seconds)) / float(host_speed)
        return crit + self.background_excess_ms(c_base, c_tok, host_speed)

    def background_ms(self, host_speed: float = 1.0) -> float:
        """The proposer's background work (ms, / ``host_speed``): what its ingest thread did while the engine ran
        the forward passes, all of it (the part beyond a step's forward pass is :meth:`background_excess_ms`)."""
        return 1000.0 * float(np.sum(self.background_seconds)) / float(host_speed) if self.background_seconds else 0.0

    def background_excess_ms(self, c_base: float, c_tok: float, host_speed: float = 1.0) -> float:
        """The background work that could not finish within its step's modelled forward pass (ms, / ``host_speed``):
        per step ``max(0, background - (c_base + c_tok * step_tokens))``. The engine's next step waits for it (the
        drafter completes its queue before it drafts), so it is on the critical path (:meth:`cpu_ms`)."""
        if not self.background_seconds or not any(self.background_seconds):
            return 0.0
        bg = 1000.0 * np.asarray(self.background_seconds, np.float64) / float(host_speed)
        fwd = c_base + c_tok * np.asarray(self.step_tokens, np.float64)
        return float(np.maximum(0.0, bg - fwd).sum())

    def time_with_cpu(self, c_base: float, c_tok: float, host_speed: float = 1.0, async_off_ms: float = 0.0) -> float:
        """Cost-model time (ms) plus the proposer's critical-path CPU (:meth:`cpu_ms`) plus, for a speculative
        method, ``async_off_ms`` per engine step (vLLM runs it with async scheduling off)."""
        extra = async_off_ms * self.steps if self.speculative else 0.0
        return self.time_at(c_base, c_tok) + self.cpu_ms(c_base, c_tok, host_speed) + extra

    @property
    def mean_passes(self) -> float:
        return float(np.mean(self.passes)) if self.passes else 0.0

    def summary(self, c_base: float | None = None, c_tok: float | None = None, host_speed: float = 1.0,
                async_off_ms: float = 0.0) -> dict:
        """The result's counts and times; with a cost model, also the times with the CPU (ms) and the CPU per step
        (ms) and per request-round (us)."""
        out = {"drafter": self.name, "requests": self.requests, "tokens": self.tokens, "rounds": self.rounds,
               "tokens_per_round": self.tokens_per_round, "draft_tokens": self.draft_tokens,
               "accepted_tokens": self.accepted_tokens, "draft_per_accepted": self.draft_per_accepted,
               "mean_passes": self.mean_passes, "tail_passes": self.steps, "sim_time_ms": self.sim_time_ms,
               "drafter_seconds": self.drafter_seconds, "background_seconds": float(np.sum(self.background_seconds)),
               "speculative": self.speculative, "cpu_clock": self.cpu_clock,
               "cpu_representative": self.cpu_representative, "counters": self.counters,
               "logprob_ms": self.logprob_ms, "verification_shape": self.verification_shape,
               "logprob_rows": self.logprob_rows()}
        if self.admission is not None:
            ttft = np.asarray(self.first_token_steps, np.float64)
            out.update(admission=self.admission, prefill_tokens=self.prefill_tokens,
                       first_token_steps_mean=float(ttft.mean()) if ttft.size else None,
                       first_token_steps_max=int(ttft.max()) if ttft.size else None)
        if self.reliability:
            out["reliability"] = self.reliability
        if c_base is not None and c_tok is not None:
            cpu = self.cpu_ms(c_base, c_tok, host_speed)
            out.update(time_ms=self.time_at(c_base, c_tok),
                       time_cpu_ms=self.time_with_cpu(c_base, c_tok, host_speed, async_off_ms), cpu_ms=cpu,
                       cpu_ms_per_step=cpu / max(1, self.steps), cpu_us_per_round=1000.0 * cpu / max(1, self.rounds))
        return out


@dataclass
class Bounds:
    """The two bounds of a replay point (no CPU in either).

    ``oracle-trim``: ``das+siblings``' replay (the default drafter's drafts at the hard cap every step), each draft
    cut to exactly its accepted tokens: its steps, with ``rounds + accepted`` verified tokens. ``oracle-text``: the
    true continuation at the draft cap ``k``: each round emits ``min(k + 1, remaining)`` tokens, all verified.
    ``short_trim_*``: optionally the same ``oracle-trim`` of a second ``das+siblings`` replay with shorter drafts
    (the K-16 drafter settings before long drafts: :data:`das_trl.bench.suite.SHORT_DRAFTS`), so the bound long
    drafts open is seen beside the one they replaced (``oracle-trim@16``). ``logprob_ms``: each verified token's
    logprob row (the patched shape: no padding, so a bound under either shape)."""

    trim_steps: int
    trim_rounds: int
    trim_accepted: int
    text_steps: int
    text_rounds: int
    tokens: int
    k: int = ORACLE_K
    short_trim_steps: int | None = None
    short_trim_rounds: int | None = None
    short_trim_accepted: int | None = None
    short_k: int | None = None
    logprob_ms: float = 0.0

    @classmethod
    def of(cls, siblings: ReplayResult, lengths: Sequence[int], k: int = ORACLE_K,
           short: ReplayResult | None = None, short_k: int | None = None) -> "Bounds":
        rounds = [math.ceil(n / (k + 1)) for n in lengths]
        extra = {} if short is None else dict(short_trim_steps=short.steps, short_trim_rounds=short.rounds,
                                              short_trim_accepted=short.accepted_tokens, short_k=short_k)
        return cls(siblings.steps, siblings.rounds, siblings.accepted_tokens, max(rounds, default=0), sum(rounds),
                   int(sum(lengths)), k, **extra, logprob_ms=siblings.logprob_ms)

    def trim_time(self, c_base: float, c_tok: float) -> float:
        return c_base * self.trim_steps + (c_tok + self.logprob_ms) * (self.trim_rounds + self.trim_accepted)

    def short_trim_time(self, c_base: float, c_tok: float) -> float | None:
        """``oracle-trim`` of the shorter drafts (ms), ``None`` without them."""
        if self.short_trim_steps is None:
            return None
        return c_base * self.short_trim_steps + (c_tok + self.logprob_ms) * (self.short_trim_rounds
                                                                             + self.short_trim_accepted)

    def text_time(self, c_base: float, c_tok: float) -> float:
        return c_base * self.text_steps + (c_tok + self.logprob_ms) * self.tokens

    @property
    def trim_tokens_per_round(self) -> float:
        return self.tokens / max(1, self.trim_rounds)

    @property
    def text_tokens_per_round(self) -> float:
        return self.tokens / max(1, self.text_rounds)


def simulate(drafter: Drafter, train_epochs: Sequence[list[RolloutRecord]], eval_records: list[RolloutRecord],
             c_base: float = 7.0, c_tok: float = 0.025, warmup: bool = True, c_logprob: float = 0.0,
             verification_shape: str = "patched", admission: Admission | None = None,
             limits=None) -> ReplayResult:
    """Replay ``eval_records`` as one continuous batch after feeding ``train_epochs`` to ``drafter``.

    With ``warmup`` (and at least 2 history epochs) the drafter first serves the last history epoch, replayed the
    same way from the epochs before it, and that epoch then enters its history through :meth:`Drafter.end_step`,
    as in a live run, where the engine drafted the previous step's rollouts before they were pushed. What a drafter
    learns from verification (DAS's acceptance calibration and the length policy's acceptance rate) is then as of
    the replayed epoch's start, not empty. Only the eval epoch is measured.

    ``c_logprob`` / ``verification_shape``: the price of the verification logprob rows (module docstring; 0: not
    charged); ``admission``: requests enter under the engine's token budget with their prompts' prefill (``None``:
    all decoding from step 0, prompts free); ``limits``: the engine's profiled verification limits
    (:func:`profiled_limits`; ``None``: none).

    Raises:
        ValueError: an unknown ``verification_shape`` or a negative ``c_logprob``.
    """
    if verification_shape not in VERIFICATION_SHAPES or not c_logprob >= 0:
        raise ValueError(f"simulate: verification_shape must be one of {VERIFICATION_SHAPES} and c_logprob >= 0, got "
                         f"{verification_shape!r}, {c_logprob}")
    price = (c_base, c_tok, float(c_logprob), verification_shape)
    if admission is not None or limits is not None:  # else the drafter's own (a test may have set them)
        drafter.engine_limits(None if admission is None else admission.token_budget,
                              None if limits is None else limits.draft_tokens,
                              None if limits is None else limits.longest_draft)
    if warmup and len(train_epochs) >= 2:
        drafter.prepare(train_epochs[:-1])
        _replay_batch(drafter, train_epochs[-1], "warmup", price, admission)
        drafter.end_step(train_epochs[-1])
    else:
        drafter.prepare(train_epochs)
    return _replay_batch(drafter, eval_records, "eval", price, admission)


class _Prefill:
    """The requests entering the engine under an :class:`Admission` (waiting, then prefilling chunk by chunk)."""

    def __init__(self, admission: Admission, records: list[RolloutRecord], waiting: list[int]) -> None:
        self.admission = admission
        self.records = records
        self.waiting = deque(waiting)
        self.prefilling: list[list[int]] = []  # [request, prompt tokens left], in admission order
        self.cached_keys: set[int] = set()     # problems whose prompt is in the prefix cache
        self.limit = admission.max_num_seqs or len(records)

    def schedule(self, decoding: int) -> tuple[int, int, int, list[int]]:
        """One step's prompt work after ``decoding`` requests' tokens: ``(prompt tokens, requests scheduled with a
        chunk, budget left for drafts, requests whose prefill completes)``."""
        left = self.admission.token_budget - decoding
        tokens = scheduled = 0
        for entry in self.prefilling:  # running requests' next chunks first
            chunk = min(entry[1], max(left, 0))
            entry[1] -= chunk
            left -= chunk
            tokens += chunk
            scheduled += chunk > 0
        while self.waiting and left > 0 and decoding + len(self.prefilling) < self.limit:
            i = self.waiting.popleft()
            rec = self.records[i]
            need = len(rec.prompt_ids) - (self.admission.cached_prompt(len(rec.prompt_ids))
                                          if rec.problem_key in self.cached_keys else 0)
            need = max(need, 1)
            chunk = min(need, left)
            left -= chunk
            tokens += chunk
            scheduled += 1
            self.prefilling.append([i, need - chunk])
        done = [i for i, rest in self.prefilling if rest == 0]
        self.prefilling = [e for e in self.prefilling if e[1] > 0]
        self.cached_keys.update(self.records[i].problem_key for i in done)  # from the next step on
        return tokens, scheduled, max(left, 0), done

    def __bool__(self) -> bool:
        return bool(self.waiting or self.prefilling)


def _replay_batch(drafter: Drafter, eval_records: list[RolloutRecord], prefix: str,
                  price: tuple[float, float, float, str], admission: Admission | None = None) -> ReplayResult:
    c_base, c_tok, c_logprob, shape = price
    n = len(eval_records)
    rids = [f"{prefix}-{i}" for i in range(n)]
    comps = [np.asarray(r.completion_ids, dtype=np.int64) for r in eval_records]
    ctx = [list(r.prompt_ids) for r in eval_records]
    pos = [0] * n
    passes = [0] * n
    first_token = [0] * n
    live = [i for i in range(n) if len(comps[i]) > 0]
    watch = drafter.watch = Stopwatch(wall_clock if drafter.wall_timed else cpu_clock)
    drafter.begin(rids, eval_records)  # the engine's arrays (not timed)
    # timed by the drafter: charged to the step where vLLM's proposer meets the request (the first, or, with
    # admission, the step its prefill completes)
    for i in range(n) if admission is None else [i for i in range(n) if len(comps[i]) == 0]:
        drafter.start(rids[i], eval_records[i])
    for i in range(n):
        if len(comps[i]) == 0:
            drafter.stop(rids[i])
    running = live if admission is None else []
    entering = None if admission is None else _Prefill(admission, eval_records, live)
    tokens = rounds = drafted_total = accepted_total = steps = prefill_total = 0
    t_ms = 0.0
    trace: list[tuple[float, int]] = []
    step_tokens: list[int] = []
    step_rows: list[int] = []
    step_drafts: list[int] = []
    step_longest: list[int] = []
    crit: list[float] = []
    background: list[float] = []
    tail = drafter.context_tail
    while running or entering:
        trace.append((t_ms, len(running)))
        # The engine does not know where a completion will end: drafts may run past it (those tokens are verified
        # and wasted, as in vLLM). The contexts are built outside the timed calls: an engine holds them in place
        # (vLLM's token_ids_cpu), so copying them here is the replay's cost, not the drafter's.
        contexts = [np.asarray(ctx[i] if tail is None else ctx[i][-tail:] if tail else (), dtype=np.int32)
                    for i in running]
        step_rows_in = [(rids[i], eval_records[i], pos[i], passes[i]) for i in running]
        drafts = list(drafter.draft_step(step_rows_in, contexts)) if running else []
        prompt_tok, prompt_rows, done = 0, 0, []
        if entering is not None:
            # the budget: decoding requests' own tokens, prompt chunks, waiting requests; drafts get what is left
            prompt_tok, prompt_rows, room, done = entering.schedule(len(running))
            lengths = np.fromiter((len(d) for d in drafts), np.int64, len(drafts))
            kept = cap_step_tokens(lengths, room) if len(drafts) else lengths
            for j in np.flatnonzero(kept < lengths):
                drafts[j] = list(drafts[j])[: int(kept[j])]
                drafter.scheduled(rids[running[j]], int(kept[j]))
        step_tok = 0
        step_draft = longest = 0
        still = []
        for i, draft in zip(running, drafts):
            comp, p = comps[i], pos[i]
            d = np.asarray(draft, dtype=np.int64)
            usable = min(len(d), len(comp) - p - 1)  # the last token is always the round's own (bonus) token
            mism = np.nonzero(d[:usable] != comp[p:p + usable])[0]
            acc = int(mism[0]) if mism.size else usable
            emit = comp[p:p + acc + 1].tolist()
            step_tok += 1 + len(d)
            step_draft += len(d)
            longest = max(longest, len(d))
            drafted_total += len(d)
            accepted_total += acc
            drafter.feedback(rids[i], len(d), acc)
            tokens += len(emit)
            rounds += 1
            passes[i] += 1
            pos[i] += len(emit)
            ctx[i].extend(emit)
            drafter.extend(rids[i], emit)
            if pos[i] >= len(comp):
                drafter.stop(rids[i])
            else:
                still.append(i)
        for i in done:  # prefill complete: the first token, sampled at the prompt's last position
            drafter.start(rids[i], eval_records[i])
            emit = comps[i][:1].tolist()
            tokens += 1
            rounds += 1
            passes[i] += 1
            pos[i] = 1
            first_token[i] = steps + 1
            ctx[i].extend(emit)
            drafter.extend(rids[i], emit)
            if pos[i] >= len(comps[i]):
                drafter.stop(rids[i])
            else:
                still.append(i)
        rows = len(running) + prompt_rows
        step_tok += prompt_tok
        prefill_total += prompt_tok
        lp_rows = logprob_rows(shape, rows, rows + step_draft, longest) if c_logprob else 0
        t_ms += c_base + c_tok * step_tok + c_logprob * lp_rows
        steps += 1
        step_tokens.append(step_tok)
        step_rows.append(rows)
        step_drafts.append(step_draft)
        step_longest.append(longest)
        c, b = watch.take()
        crit.append(c)
        background.append(b)
        running = still
    drafter.drain()  # the proposer's call after the last forward pass (still before the engine returns)
    c, b = watch.take()
    if crit:
        crit[-1] += c
        background[-1] += b
    elif c or b:
        crit, background, step_tokens = [c], [b], [0]
        step_rows, step_drafts, step_longest = [0], [0], [0]
    trace.append((t_ms, 0))
    return ReplayResult(drafter.name, n, tokens, rounds, drafted_total, accepted_total, steps, t_ms, passes,
                        [len(c) for c in comps], trace, float(sum(crit)), step_tokens, crit, background,
                        speculative=drafter.speculative, cpu_clock=drafter.cpu_clock_name,
                        cpu_representative=drafter.cpu_representative, counters=drafter.replay_counters(),
                        reliability=drafter.reliability_summary(), step_rows=step_rows, step_drafts=step_drafts,
                        step_longest=step_longest, logprob_ms=float(c_logprob), verification_shape=shape,
                        prefill_tokens=prefill_total,
                        first_token_steps=[] if admission is None else [first_token[i] for i in live],
                        admission=None if admission is None else dataclasses.asdict(admission))

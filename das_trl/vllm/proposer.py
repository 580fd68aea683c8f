"""The DAS proposer that vLLM runs inside its worker (``speculative_config`` method ``custom_class``).

vLLM instantiates ``DASProposer(vllm_config)`` in the model runner and calls :meth:`DASProposer.propose` after every
engine step with the tokens each running request just got. ``propose`` receives no request ids, so until the worker
extension hands it the model runner (:meth:`DASProposer.attach`) it proposes nothing and says so in its stats. Once
attached, it maps each batch row to its request (``input_batch.req_ids``), hands the step to the
:class:`~das_trl.vllm.speculator.Speculator` (plan, draft the planned rows with the native drafter, cut), and returns
one draft per row; vLLM's rejection sampler verifies the drafts, so outputs are those of the target model.

Upstream API: ``vllm/v1/spec_decode/custom_class_proposer.py`` and ``GPUModelRunner.propose_draft_token_ids``
(vLLM 0.32), modelled on vLLM's own ``SuffixDecodingProposer``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import numpy as np

from das_trl.drafter import DrafterConfig, create_drafter, problem_key
from das_trl.budget import BudgetController, ControllerConfig
from das_trl.budget.cost_model import assumed_c_logprob_ms
from das_trl.drafter.conversation import ConversationKeys
from das_trl.vllm.filled_views import FilledViews
from das_trl.vllm.speculator import Speculator
from das_trl.vllm.verification_logprobs import verification_shape
from das_trl.vllm.verification_profile import VerificationLimits, install_profile_hook, verification_limits

logger = logging.getLogger(__name__)

# SamplingParams.extra_args key (OpenAI field ``vllm_xargs``) for an explicit problem id; GRPO siblings share it.
PROBLEM_ID_KEY = "das_problem_id"

#: ``int32 [rows, 0]``: its ``tolist()`` makes one new empty list per row in one C call (a Python loop over the rows
#: cost ~1.6x as much), the drafts of a step's rows before the drafted ones are filled in.
_NO_DRAFTS = np.empty((1024, 0), np.int32)


def scheduler_token_budget(vllm_config: Any) -> int | None:
    """The most tokens vLLM's scheduler issues in one step, draft tokens included: ``max_num_scheduled_tokens``
    where the config sets it (vLLM 0.32 and 0.33 fill it from ``max_num_batched_tokens`` when speculation is on,
    ``VllmConfig._set_max_num_scheduled_tokens``; 0.33 lets it be smaller), else ``max_num_batched_tokens``; ``None``
    when neither is known."""
    sched = getattr(vllm_config, "scheduler_config", None)
    for name in ("max_num_scheduled_tokens", "max_num_batched_tokens"):
        value = getattr(sched, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


class DASProposer:
    """vLLM custom proposer backed by the DAS drafter and budget controller (:class:`Speculator`).

    Args:
        vllm_config: vLLM's ``VllmConfig``; ``speculative_config.num_speculative_tokens`` (K) is the most tokens vLLM
            schedules per request per round, so every draft is capped at K.

    Drafts are variable length (0..K tokens per request); vLLM pads them. Counters kept here (see :meth:`stats`) are
    the proposer's view; vLLM's ``spec_decode`` metrics remain the authoritative acceptance figures.
    """

    def __init__(self, vllm_config: Any):
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.engine_dtype = str(getattr(vllm_config.model_config, "dtype", "")).removeprefix("torch.") or None
        # One step = plan (which rows can pay), draft, cut (what pays): das_trl.vllm.speculator, the object the replay
        # benchmark drives too. Budgets come from the batch budget controller (das_trl.budget).
        # vLLM's scheduler counts draft tokens against its token budget: never offer more than it schedules.
        sched = getattr(vllm_config, "scheduler_config", None)
        batched = getattr(sched, "max_num_batched_tokens", None)
        self.max_num_batched_tokens = int(batched) if batched else None
        self.max_num_scheduled_tokens = scheduler_token_budget(vllm_config)
        # Every step within the shape vLLM's memory profile ran (das_trl.vllm.verification_profile); on a GPU the
        # profile hook makes that run include verification with logprobs.
        self.verification_shape = verification_shape()
        self.verification_limits: VerificationLimits | None = None
        if sched is not None:
            self.verification_limits = verification_limits(vllm_config, self.verification_shape,
                                                           cpu=_is_cpu_platform())
        if self.verification_limits is not None and self.verification_limits.draft_tokens is not None:
            install_profile_hook()
        self.speculator = self._speculator(create_drafter(DrafterConfig(max_spec_tokens=self.num_speculative_tokens)),
                                           BudgetController(self.engine_controller_config(ControllerConfig())))
        self._step_end: float | None = None  # _clock() at the end of the last propose (online cost fit)
        self._clock = time.perf_counter      # seconds; replaceable in tests
        self._runner: Any = None
        self._last_req_ids: list[str] = []  # the batch's request ids at the last step (finish detection)
        self._all_rows = np.zeros(0, np.int32)  # arange(n) for steps in which every row decodes
        self._filled = FilledViews()  # constant int32 rows (1: one sampled token per row)
        # A history push builds its automata in the background; the first step after it waits for them, so which
        # history a draft sees never depends on timing (same seed, same drafts, same sampled rollouts).
        self._history_pending = False
        # First prompts of conversations -> problem keys, so later turns draft from their problem (multi-turn).
        self.conversations = ConversationKeys()
        self._conversation_lock = threading.Lock()
        self._counters = dict(rounds=0, unattached_rounds=0, speculation_seconds=0.0)

    def engine_controller_config(self, config: ControllerConfig) -> ControllerConfig:
        """``config`` priced as this engine runs verification: its ``verification_shape`` is the engine's
        (:func:`~das_trl.vllm.verification_logprobs.verification_shape`: ``"patched"`` where das-trl's logprob patch
        is installed, else vLLM's ``"padded"``), and an unset ``c_logprob_ms`` becomes the assumed figure at the
        model's vocabulary (:func:`~das_trl.budget.cost_model.assumed_c_logprob_ms`)."""
        logprob = assumed_c_logprob_ms(self.vocab_size) if config.c_logprob_ms is None else config.c_logprob_ms
        if config.verification_shape == self.verification_shape and config.c_logprob_ms == logprob:
            return config
        return dataclasses.replace(config, verification_shape=self.verification_shape, c_logprob_ms=logprob)

    def _speculator(self, drafter: Any, controller: BudgetController) -> Speculator:
        """A :class:`Speculator` with the engine's limits: the scheduler's token budget and the profiled
        verification shape."""
        limits = self.verification_limits
        return Speculator(drafter, controller, self.max_model_len, max_step_tokens=self.max_num_scheduled_tokens,
                          max_step_drafts=None if limits is None else limits.draft_tokens,
                          max_draft_len=None if limits is None else limits.longest_draft)

    @property
    def drafter(self) -> Any:
        """The drafter (``das_trl.drafter.create_drafter``); assigning one replaces it for the next steps."""
        return self.speculator.drafter

    @drafter.setter
    def drafter(self, drafter: Any) -> None:
        for req_id in self.speculator.tracked():
            self.speculator.finish(req_id)
        self.speculator = self._speculator(drafter, self.speculator.controller)

    @property
    def controller(self) -> BudgetController:
        """The budget controller (``das_trl.budget.BudgetController``)."""
        return self.speculator.controller

    @controller.setter
    def controller(self, controller: BudgetController) -> None:
        self.speculator.set_controller(controller)

    # vLLM's CPU runner calls this unconditionally; a suffix-tree drafter has no model to load.
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No-op: the drafter is built from rollout history, not from weights."""

    @property
    def attached(self) -> bool:
        """Whether :meth:`attach` has given the proposer its model runner (and so request identities)."""
        return self._runner is not None

    def attach(self, model_runner: Any, drafter_config: DrafterConfig | None = None,
               controller_config: ControllerConfig | None = None) -> None:
        """Give the proposer the model runner whose ``input_batch`` maps batch rows to requests.

        Args:
            model_runner: vLLM's ``GPUModelRunner`` (also the CPU runner's base class).
            drafter_config: when given and different from the current one, the drafter is rebuilt with it and its
                history is carried over.
            controller_config: when given, the budget controller is rebuilt with it (the problems' lengths are
                replayed from the history).

        Raises:
            TypeError: ``model_runner`` has no ``input_batch``.
            ValueError: ``drafter_config.max_spec_tokens`` exceeds K.
        """
        if not hasattr(model_runner, "input_batch"):
            raise TypeError(f"{type(model_runner).__name__} has no input_batch: not a vLLM V1 model runner")
        if drafter_config is not None and drafter_config.max_spec_tokens > self.num_speculative_tokens:
            raise ValueError(
                f"max_spec_tokens={drafter_config.max_spec_tokens} exceeds the engine's num_speculative_tokens="
                f"{self.num_speculative_tokens}"
            )
        # Retire the requests tracked so far: clearing the bookkeeping alone left them active in the drafter forever
        # (a re-attach between two generations orphaned the last batch's requests).
        for req_id in self.speculator.tracked():
            self.speculator.finish(req_id)
        if drafter_config is not None:
            if drafter_config != self.drafter.config:
                state = self.drafter.state_dict()
                drafter = create_drafter(drafter_config)
                drafter.load_state_dict(state)
                self.drafter = drafter
        if controller_config is not None:
            self.controller = BudgetController(self.engine_controller_config(controller_config))
            self._observe_history()
        self._step_end = None
        self._runner = model_runner

    def _observe_history(self) -> None:
        """Feed every problem's windowed completion lengths to the controller (after a rebuild or a load)."""
        for key in self.drafter.history_problems():
            self.controller.observe(key, self.drafter.history_lengths(key).tolist())

    def load_history(self, state: dict[str, Any]) -> None:
        """Replace the drafter's history with a saved one (``RolloutHistory.to_state()`` dict) and refresh the length
        controller from it. Raises ``ValueError`` on a malformed state (nothing changed)."""
        self.drafter.load_state_dict({"history": state})
        self._observe_history()

    def add_history(self, prompts: list, completions: list, problem_keys: list | None = None,
                    background: bool = True) -> dict[str, Any]:
        """Add one step's rollouts to the drafter's history and their lengths to the budget controller.

        Args:
            prompts / completions: token ids per rollout (``list[list[int]]`` or int32 arrays), paired by index.
            problem_keys: explicit problem key per rollout (default: hash of the prompt ids).
            background: build the automata on the drafter's builder threads and return at once; the next engine
                step waits for them (in a GRPO loop the push happens between generations, while weights sync), so
                the history a draft sees does not depend on timing and runs with the same seed draft the same.

        Returns:
            the drafter's ``add_rollouts`` summary.

        Raises:
            ValueError: invalid ids or keys (nothing is changed).
        """
        added = self.drafter.add_rollouts(prompts, completions, problem_keys, background=background)
        self._history_pending = background
        lengths: dict[int, list[int]] = {}
        for i, (prompt, comp) in enumerate(zip(prompts, completions)):
            key = int(problem_keys[i]) if problem_keys is not None else problem_key(prompt)
            if key not in lengths:  # the conversation's first prompt: later turns extend it
                with self._conversation_lock:
                    self.conversations.register(np.asarray(prompt, dtype=np.int64), key)
            lengths.setdefault(key, []).append(len(comp))
        for key, lens in lengths.items():
            self.controller.observe(key, lens)
        self.speculator.new_history()
        return added

    def detach(self) -> None:
        """Forget the model runner: from the next round on the proposer drafts nothing (history is kept)."""
        for req_id in self.speculator.tracked():
            self.speculator.finish(req_id)
        self._runner = None

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Draft tokens for every request in the batch: one drafter ``step`` for the whole batch.

        Args:
            sampled_token_ids: per batch row, the tokens the row got this step (accepted drafts + one sampled token);
                empty for a partial prefill.
            num_tokens_no_spec: ``np.int32 [max_num_reqs]``: tokens per row (prompt + output), drafts excluded.
            token_ids_cpu: ``np.int32 [max_num_reqs, max_model_len]``: each row's tokens (read in place).
            slot_mappings: unused (no KV cache of our own).

        Returns:
            ``list[list[int]]`` with one draft (0..K token ids) per row of ``sampled_token_ids``.
        """
        self._counters["rounds"] += 1
        n = len(sampled_token_ids)
        if self._runner is None:
            self._counters["unattached_rounds"] += 1
            return [[] for _ in range(n)]
        started = self._clock()
        if self._history_pending:
            # Usually already built (the push ran during the weight sync); on the critical path only if not.
            self.drafter.wait_for_updates()
            self._history_pending = False
        spec = self.speculator
        batch = self._runner.input_batch
        req_ids = batch.req_ids[:n]
        changed = req_ids != self._last_req_ids
        if changed:  # requests left or joined: retire the ones gone
            live = set(req_ids)
            for req_id in [r for r in spec.tracked() if r not in live]:
                spec.finish(req_id)
            self._last_req_ids = req_ids
        # int32 throughout, as vLLM holds them: the drafter takes int32 arrays without converting them.
        if not spec.drafted and all(sampled_token_ids):
            # No draft in flight (the last step sent none): every row got exactly its one sampled token, so the
            # per-row lengths are known without reading them (8 us at 256 rows, most of a quiet step's glue).
            num_sampled, every_row = self._filled(1, n), True
        else:
            num_sampled = np.fromiter(map(len, sampled_token_ids), dtype=np.int32, count=n)
            every_row = bool(num_sampled.all())
        full = len(req_ids) == n and every_row
        if full:  # every row decodes (the usual step): vLLM's arrays are read as slices, without a copy
            if len(self._all_rows) != n:
                self._all_rows = np.arange(n, dtype=np.int32)
            rows, ids = self._all_rows, req_ids
            num_tokens = np.asarray(num_tokens_no_spec[:n], dtype=np.int32)
            num_prompt = np.asarray(batch.num_prompt_tokens[:n], dtype=np.int32)
        else:
            rows = np.flatnonzero(num_sampled).astype(np.int32)  # partial prefills: nothing to extend from yet
            ids = [req_ids[r] for r in rows.tolist()]
            num_tokens = np.asarray(num_tokens_no_spec[:n], dtype=np.int32)[rows]
            num_prompt = np.asarray(batch.num_prompt_tokens[:n], dtype=np.int32)[rows]
        # Same batch as last step and every row tracked: nothing new to start (no per-row scan).
        same = not changed and len(ids) == n == len(spec)
        new_rows = [] if same else [i for i, req_id in enumerate(ids) if req_id not in spec]
        for i in new_rows:  # first sight of a request
            self._start(ids[i], token_ids_cpu[rows[i], :num_prompt[i]])
        verified = self._verified_lengths(rows)
        step_ms = None
        if self._step_end is not None and not new_rows and len(rows) == n:
            # Only steps whose every token is known time the engine (no prefill chunk); the opt-in online cost fit
            # (cost_source="online") reads them.
            step_ms = 1000.0 * (started - self._step_end)
        out = spec.step(ids, token_ids_cpu, rows, num_tokens, num_prompt, num_sampled if full else num_sampled[rows],
                        verified, step_ms)
        # one new list per row (vLLM keeps each as its request's spec_token_ids): no two rows may share one
        drafts: list[list[int]] = _NO_DRAFTS[:n].tolist() if n <= len(_NO_DRAFTS) else [[] for _ in range(n)]
        if spec.drafted:  # only rows with a draft become Python lists
            for i in np.flatnonzero(out.lengths).tolist():
                drafts[int(rows[i])] = out.tokens[i, : out.lengths[i]].tolist()
        self._step_end = self._clock()
        self._counters["speculation_seconds"] += self._step_end - started
        return drafts

    def _start(self, req_id: str, prompt: np.ndarray) -> None:
        """Start tracking a request with its problem key and, when vLLM knows it, its ``max_tokens`` (the
        controller's cap on its remaining length)."""
        request = getattr(self._runner, "requests", {}).get(req_id)
        max_tokens = getattr(getattr(request, "sampling_params", None), "max_tokens", None)
        self.speculator.start(req_id, prompt, self._request_problem_key(req_id, prompt),
                              max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None)

    def _verified_lengths(self, rows: np.ndarray) -> np.ndarray:
        """How many draft tokens vLLM scheduled (verified) per row this step: the scheduler trims a draft to the
        step's token budget and the model runner records the scheduled length in ``num_decode_draft_tokens``
        (vLLM 0.32; -1 for prompt chunks). -1 where unknown: the drafter then counts the whole draft as sent."""
        buf = getattr(self._runner, "num_decode_draft_tokens", None)
        arr = getattr(buf, "np", None)
        if arr is None:
            return np.full(len(rows), -1, np.int32)
        arr = np.asarray(arr)
        n = len(rows)
        if n <= len(arr) and rows is self._all_rows and arr.dtype == np.int32:
            return arr[:n]  # every row, in order: a view (read during the step only)
        out = np.full(n, -1, np.int32)
        ok = rows < len(arr)
        out[ok] = arr[rows[ok]]
        return out

    def _request_problem_key(self, req_id: str, prompt: np.ndarray) -> int:
        """A request's problem key: the explicit ``das_problem_id`` if sent; else the key of its conversation's first
        prompt (a later turn of a multi-turn / tool-calling rollout extends it; :mod:`das_trl.drafter.conversation`);
        else the hash of its prompt, which is registered as a conversation's first prompt."""
        explicit = self._explicit_problem_key(req_id)
        if explicit is not None:
            return explicit
        with self._conversation_lock:
            return self.conversations.key_of(prompt)

    def _explicit_problem_key(self, req_id: str) -> int | None:
        """The problem id sent as ``SamplingParams.extra_args[PROBLEM_ID_KEY]``, if any (else the prompt is hashed)."""
        request = getattr(self._runner, "requests", {}).get(req_id)
        extra = getattr(getattr(request, "sampling_params", None), "extra_args", None) or {}
        value = extra.get(PROBLEM_ID_KEY)
        if value is None:
            return None
        try:
            key = int(value)
        except (TypeError, ValueError):
            logger.warning("ignoring non-integer %s=%r for request %s", PROBLEM_ID_KEY, value, req_id)
            return None
        if not 0 <= key < 2**63:
            logger.warning("ignoring %s=%r for request %s: problem ids must be ints in [0, 2**63)", PROBLEM_ID_KEY,
                           value, req_id)
            return None
        return key

    def stats(self) -> dict[str, Any]:
        """Proposer counters merged with the drafter's stats (history size, sources); JSON-serializable.

        Keys: ``attached`` (bool), ``engine_dtype`` (the dtype the engine's model computes in, e.g. ``"float32"``),
        ``rounds`` (propose calls), ``unattached_rounds`` (calls that proposed nothing
        because :meth:`attach` had not run), ``request_rounds``, ``drafts`` (non-empty drafts), ``draft_tokens``,
        ``accepted_tokens`` (as seen by the proposer: the final draft of each request is never observed),
        ``speculation_seconds`` (time spent in :meth:`propose`), ``speculated_rows`` (request-rounds the drafter
        drafted: the controller's plan found they could pay), ``silent_steps`` (steps in which no row was drafted),
        ``quiet_steps`` (silent steps that also skipped the plan: nothing paid at the last one),
        ``capped_steps`` (steps whose kept drafts were cut to the scheduler's token budget or the verification
        limits), ``peak_step_tokens`` (the most tokens one step offered the engine: its rows plus their draft tokens),
        ``peak_step_drafts`` / ``peak_draft_len`` (the most draft tokens one step, and one row, sent),
        ``max_num_batched_tokens`` (the engine's tokens per forward pass), ``max_num_scheduled_tokens`` (the
        scheduler's token budget per step, draft tokens included: the step cap), ``verification_shape``
        (``"patched"``: verification logprobs at the verified positions only; ``"padded"``: vLLM's rows x (longest
        draft + 1), :mod:`das_trl.vllm.verification_logprobs`), ``verify_profiled_rows``, ``verify_draft_limit``,
        ``verify_draft_len_limit`` and ``verify_limit_source`` (the profiled verification shape and the per-step
        limits derived from it, ``None``: no limit; :mod:`das_trl.vllm.verification_profile`), ``budget_*``: the
        budget controller's diagnostics (:meth:`BudgetController.stats` prefixed), ``budget_counters`` (which ``budget_*`` keys are cumulative), ``num_speculative_tokens``, ``history_problems``,
        ``history_appearances``, ``history_sequences``, ``history_tokens``, ``history_bytes`` (the history's token
        storage plus the native core's history automata, ``index_bytes`` + ``global_bytes``; the reference drafter
        counts its support table instead of its trees),
        ``history_evicted_appearances``, ``active_requests``, ``calibration_tokens`` (verified draft tokens the drafter's
        acceptance calibration learned from), the drafter's live pool (``live_running_tokens``,
        ``live_finished_tokens``, ``live_token_budget``, ``live_evicted_outputs``, ``live_approx_bytes``: see
        ``NativeDASDrafter.stats``), ``conversation_prompts`` / ``conversation_prompts_evicted`` (first prompts known for
        multi-turn keys, at most 65,536), ``source_<name>`` (drafts won by each source) and ``drafter_backend``
        (``"native"`` or ``"python"``).
        """
        limits = self.verification_limits
        out: dict[str, Any] = {"attached": self.attached, "num_speculative_tokens": self.num_speculative_tokens,
                               "engine_dtype": self.engine_dtype, "max_num_batched_tokens": self.max_num_batched_tokens,
                               "max_num_scheduled_tokens": self.max_num_scheduled_tokens,
                               "verification_shape": self.verification_shape,
                               "verify_profiled_rows": None if limits is None else limits.profiled_rows,
                               "verify_draft_limit": None if limits is None else limits.draft_tokens,
                               "verify_draft_len_limit": None if limits is None else limits.longest_draft,
                               "verify_limit_source": None if limits is None else limits.source}
        out.update(self._counters)
        spec = self.speculator.counters
        out.update({k: spec[k] for k in ("request_rounds", "drafts", "draft_tokens", "verified_drafts",
                                         "accepted_tokens", "speculated_rows", "silent_steps", "quiet_steps",
                                         "capped_steps", "peak_step_tokens", "peak_step_drafts", "peak_draft_len")})
        # The controller's diagnostics, by prefix; `budget_counters` names the cumulative ones (the trainer logs
        # their per-step differences and the rest as they are).
        out.update({f"budget_{k}": v for k, v in self.controller.stats().items()})
        out["budget_counters"] = [f"budget_{k}" for k in BudgetController.COUNTERS]
        d = self.drafter.stats()
        out.update(
            history_problems=d["problems"],
            history_appearances=d["appearances"],
            history_sequences=d["sequences"],
            history_tokens=d["tokens"],
            history_bytes=(d["approx_bytes"] + d["support_table_bytes"] + d.get("index_bytes", 0)
                           + d.get("global_bytes", 0)),
            history_evicted_appearances=d["evicted_appearances"],
            active_requests=d["active_requests"],
            history_pending_updates=d["pending_updates"],
            history_update_seconds=d["update_seconds"],
            calibration_tokens=d["calibration_tokens"],
        )
        out.update({k: d[k] for k in ("live_running_tokens", "live_finished_tokens", "live_token_budget",
                                      "live_evicted_outputs", "live_approx_bytes") if k in d})
        with self._conversation_lock:
            out.update(self.conversations.stats())
        # Which source's candidate won each non-empty draft (per-problem history, running siblings, local, global).
        out.update({f"source_{name}": count for name, count in d["wins"].items()})
        out["drafter_backend"] = d.get("backend", "python")  # the trainer logs das/native_core from it (server mode)
        return out

    def reset_history(self) -> None:
        """Drop the drafter's history and live requests (the drafter's ``reset``). The requests tracked so far are
        forgotten here too: one still running is taken up again at its next round (the drafter catches up from the
        engine's token rows), and one that ended is not stopped twice."""
        self.drafter.reset()
        self.speculator.forget()
        self._last_req_ids = []

    def reset_counters(self) -> None:
        """Zero the proposer's counters (history is kept)."""
        for key in self._counters:
            self._counters[key] = 0.0 if key == "speculation_seconds" else 0
        for key in self.speculator.counters:
            self.speculator.counters[key] = 0
        self.controller.reset_counters()

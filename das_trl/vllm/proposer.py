"""The DAS proposer that vLLM runs inside its worker (``speculative_config`` method ``custom_class``).

vLLM instantiates ``DASProposer(vllm_config)`` in the model runner and calls :meth:`DASProposer.propose` after every
engine step with the tokens each running request just got. ``propose`` receives no request ids, so until the worker
extension hands it the model runner (:meth:`DASProposer.attach`) it proposes nothing and says so in its stats. Once
attached, it maps each batch row to its request (``input_batch.req_ids``), feeds the request's new tokens to the
:class:`~das_trl.drafter.DASDrafter`, and returns one draft per row; vLLM's rejection sampler verifies the drafts, so
outputs are those of the target model.

Upstream API: ``vllm/v1/spec_decode/custom_class_proposer.py`` and ``GPUModelRunner.propose_draft_token_ids``
(vLLM 0.32), modelled on vLLM's own ``SuffixDecodingProposer``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from das_trl.drafter import DASDrafter, DrafterConfig, problem_key
from das_trl.drafter.controller import BudgetController, ControllerConfig
from das_trl.drafter.policy import TIER_NAMES, LengthPolicy, LengthPolicyConfig

logger = logging.getLogger(__name__)

# SamplingParams.extra_args key (OpenAI field ``vllm_xargs``) for an explicit problem id; GRPO siblings share it.
PROBLEM_ID_KEY = "das_problem_id"


class DASProposer:
    """vLLM custom proposer backed by a :class:`DASDrafter`.

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
        self.drafter = DASDrafter(DrafterConfig(max_spec_tokens=self.num_speculative_tokens))
        # Per-round budgets: the batch budget controller by default (drafts first, then keeps what pays, see
        # das_trl.drafter.controller); a LengthPolicy (tiers / cost / fixed, budgets before drafting) when
        # attach() is given a policy_config. Both are the objects the replay benchmark uses.
        self.policy = LengthPolicy(LengthPolicyConfig(max_budget=self.num_speculative_tokens))
        self.controller = BudgetController(ControllerConfig())
        self.budget_source = "controller"  # or "length_policy"
        self._rounds: dict[str, int] = {}      # verification rounds per request (controller input)
        self._max_output: dict[str, int] = {}  # the request's max_tokens, when known (controller input)
        # Per request: the controller's acceptance estimate for its last kept draft (reported back once verified).
        self._expected_kept: dict[str, float] = {}
        self._step_end: float | None = None    # _clock() at the end of the last propose (online cost fit)
        self._clock = time.perf_counter         # seconds; replaceable in tests
        self._runner: Any = None
        # Per request: output tokens already given to the drafter, and the length of its last draft.
        self._known_output: dict[str, int] = {}
        self._last_draft_len: dict[str, int] = {}
        self._counters = dict(
            rounds=0,
            unattached_rounds=0,
            request_rounds=0,
            drafts=0,
            draft_tokens=0,
            accepted_tokens=0,
            verified_drafts=0,
            speculation_seconds=0.0,
            **{f"budget_tier_{name}_rounds": 0 for name in TIER_NAMES},
            **{f"budget_tier_{name}_tokens": 0 for name in TIER_NAMES},
        )

    # vLLM's CPU runner calls this unconditionally; a suffix-tree drafter has no model to load.
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No-op: the drafter is built from rollout history, not from weights."""

    @property
    def attached(self) -> bool:
        """Whether :meth:`attach` has given the proposer its model runner (and so request identities)."""
        return self._runner is not None

    def attach(self, model_runner: Any, drafter_config: DrafterConfig | None = None,
               policy_config: LengthPolicyConfig | None = None,
               controller_config: ControllerConfig | None = None) -> None:
        """Give the proposer the model runner whose ``input_batch`` maps batch rows to requests.

        Args:
            model_runner: vLLM's ``GPUModelRunner`` (also the CPU runner's base class).
            drafter_config: when given and different from the current one, the drafter is rebuilt with it and its
                history is carried over.
            policy_config: when given, the length policy is rebuilt with it (its ``max_budget`` is capped at K), the
                problems' observed lengths are replayed from the history so tiers survive the change, and budgets
                come from it (``budget_source = "length_policy"``).
            controller_config: when given, the budget controller is rebuilt with it (lengths replayed from the
                history) and budgets come from it (``budget_source = "controller"``, the default). With both
                configs, the controller wins.

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
        for req_id in list(self._known_output):
            self._finish(req_id)
        if drafter_config is not None:
            if drafter_config != self.drafter.config:
                state = self.drafter.state_dict()
                self.drafter = DASDrafter(drafter_config)
                self.drafter.load_state_dict(state)
        if policy_config is not None:
            capped = min(policy_config.max_budget, self.num_speculative_tokens)
            self.policy = LengthPolicy(LengthPolicyConfig(**{**policy_config.to_dict(), "max_budget": capped}))
            self.budget_source = "length_policy"
        if controller_config is not None:
            self.controller = BudgetController(controller_config)
            self.budget_source = "controller"
        if policy_config is not None or controller_config is not None:
            self._observe_history()
        self._step_end = None
        self._runner = model_runner

    def _observe_history(self) -> None:
        """Feed every problem's windowed completion lengths to the length policy and the controller (after a rebuild
        or a load)."""
        for key in self.drafter.history_problems():
            lengths = self.drafter.history_lengths(key).tolist()
            self.policy.observe(key, lengths)
            self.controller.observe(key, lengths)

    def load_history(self, state: dict[str, Any]) -> None:
        """Replace the drafter's history with a saved one (``RolloutHistory.to_state()`` dict) and refresh the length
        policy from it. Raises ``ValueError`` on a malformed state (nothing changed)."""
        self.drafter.load_state_dict({"history": state})
        self._observe_history()

    def add_history(self, prompts: list, completions: list, problem_keys: list | None = None,
                    background: bool = True) -> dict[str, Any]:
        """Add one step's rollouts to the drafter's history and their lengths to the length policy.

        Args:
            prompts / completions: token ids per rollout (``list[list[int]]`` or int32 arrays), paired by index.
            problem_keys: explicit problem key per rollout (default: hash of the prompt ids).
            background: build the suffix trees on the drafter's updater thread (see ``DASDrafter.add_rollouts``):
                the engine keeps generating meanwhile.

        Returns:
            ``DASDrafter.add_rollouts``'s summary.

        Raises:
            ValueError: invalid ids or keys (nothing is changed).
        """
        added = self.drafter.add_rollouts(prompts, completions, problem_keys, background=background)
        lengths: dict[int, list[int]] = {}
        for i, (prompt, comp) in enumerate(zip(prompts, completions)):
            key = int(problem_keys[i]) if problem_keys is not None else problem_key(prompt)
            lengths.setdefault(key, []).append(len(comp))
        for key, lens in lengths.items():
            self.policy.observe(key, lens)
            self.controller.observe(key, lens)
        return added

    def detach(self) -> None:
        """Forget the model runner: from the next round on the proposer drafts nothing (history is kept)."""
        for req_id in list(self._known_output):
            self._finish(req_id)
        self._runner = None

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Draft tokens for every request in the batch.

        Args:
            sampled_token_ids: per batch row, the tokens the row got this step (accepted drafts + one sampled token);
                empty for a partial prefill.
            num_tokens_no_spec: ``np.int32 [max_num_reqs]``: tokens per row (prompt + output), drafts excluded.
            token_ids_cpu: ``np.int32 [max_num_reqs, max_model_len]``: each row's tokens.
            slot_mappings: unused (no KV cache of our own).

        Returns:
            ``list[list[int]]`` with one draft (0..K token ids) per row of ``sampled_token_ids``.
        """
        self._counters["rounds"] += 1
        if self._runner is None:
            self._counters["unattached_rounds"] += 1
            return [[] for _ in sampled_token_ids]
        started = self._clock()
        if self.budget_source == "controller":
            self._observe_step_time(started, sampled_token_ids)
        batch = self._runner.input_batch
        live = set(batch.req_ids[: len(sampled_token_ids)])
        for req_id in [r for r in self._known_output if r not in live]:
            self._finish(req_id)
        # 1. Bring every request's text up to date (and learn how many of last round's draft tokens were accepted).
        rows: list[tuple[int, str, int, int]] = []  # (row, req_id, num_tokens, output_len)
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled:  # partial prefill: nothing to extend from yet
                continue
            req_id = batch.req_ids[row]
            num_tokens = int(num_tokens_no_spec[row])
            num_prompt = int(batch.num_prompt_tokens[row])
            self._sync_request(req_id, row, num_prompt, num_tokens, len(sampled), token_ids_cpu)
            rows.append((row, req_id, num_tokens, num_tokens - num_prompt))
        if self.budget_source == "controller":
            drafts = self._controller_drafts(rows, len(sampled_token_ids))
            self._step_end = self._clock()
            self._counters["speculation_seconds"] += self._step_end - started
            return drafts
        # 2. Budgets from the length policy: long (and promoted) requests get more, all grow as the batch drains.
        keys = [self.drafter.problem_of(req_id) for _, req_id, _, _ in rows]
        budgets = self.policy.budgets([(k, n) for k, (_, _, _, n) in zip(keys, rows)], num_running=len(live))
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        for (row, req_id, num_tokens, output_len), key, budget in zip(rows, keys, budgets):
            tier = TIER_NAMES[self.policy.tier(key, output_len)]
            self._counters[f"budget_tier_{tier}_rounds"] += 1
            self._counters[f"budget_tier_{tier}_tokens"] += len(sampled_token_ids[row])
            budget = min(budget, self.num_speculative_tokens, self.max_model_len - num_tokens - 1)
            draft: list[int] = []
            if budget > 0:
                start = max(0, num_tokens - self.drafter.config.match_context_tokens)
                draft = self.drafter.propose(req_id, token_ids_cpu[row, start:num_tokens], budget)
            self._last_draft_len[req_id] = len(draft)
            self._counters["request_rounds"] += 1
            if draft:
                self._counters["drafts"] += 1
                self._counters["draft_tokens"] += len(draft)
            drafts[row] = draft
        self._counters["speculation_seconds"] += self._clock() - started
        return drafts

    # ------------------------------------------------------------------ budgets from the controller
    def _controller_drafts(self, rows: list[tuple[int, str, int, int]], num_rows: int) -> list[list[int]]:
        """Draft every row up to its hard cap, let the controller keep what pays, cut the drafts to that.

        ``rows``: ``(batch row, request id, tokens so far, output tokens so far)`` of the rows with sampled tokens.
        Returns one draft per batch row (``num_rows``). The kept length is what vLLM verifies and what
        :meth:`_sync_request` reports back to the drafter as ``num_verified`` next round."""
        drafts: list[list[int]] = [[] for _ in range(num_rows)]
        if not rows:
            return drafts
        n = len(rows)
        req_ids = [req_id for _, req_id, _, _ in rows]
        num_tokens = np.fromiter((t for _, _, t, _ in rows), np.int64, n)
        hard_cap = np.clip(self.max_model_len - num_tokens - 1, 0, self.num_speculative_tokens)
        batch = self.drafter.propose_batch(req_ids, hard_cap)
        keys = np.fromiter((self.drafter.problem_of(r) for r in req_ids), np.int64, n)
        output_len = np.fromiter((o for _, _, _, o in rows), np.int64, n)
        rounds = np.fromiter((self._rounds.get(r, 0) for r in req_ids), np.int64, n)
        max_out = np.fromiter((self._max_output.get(r, 0) for r in req_ids), np.int64, n)
        max_out = np.where(max_out > 0, max_out, self.max_model_len)
        batch.truncate(self.controller.budgets(batch.accept, keys, output_len, rounds, max_out))
        lengths = batch.lengths.tolist()
        for (row, req_id, _, _), draft, k, e in zip(rows, batch.as_lists(), lengths,
                                                    self.controller.last_expected_kept.tolist()):
            drafts[row] = draft
            self._last_draft_len[req_id] = k
            self._expected_kept[req_id] = e
        self._counters["request_rounds"] += n
        self._counters["drafts"] += sum(1 for k in lengths if k)
        self._counters["draft_tokens"] += sum(lengths)
        return drafts

    def _observe_step_time(self, now: float, sampled_token_ids: list[list[int]]) -> None:
        """Feed the controller's online cost fit with the step that just ran, when every token in it is known: rows
        seen before, each verifying 1 sampled + its scheduled draft tokens. Steps with a new row or a partial prefill
        (prompt chunks the proposer cannot size) are skipped; the interval measured is from the end of the last
        ``propose`` to now (forward pass, sampling, scheduling; not the drafter's own time)."""
        if self._step_end is None:
            return
        batch = self._runner.input_batch
        tokens = 0
        for row, sampled in enumerate(sampled_token_ids):
            req_id = batch.req_ids[row]
            if not sampled or req_id not in self._known_output:
                return
            last = self._last_draft_len.get(req_id, 0)
            tokens += 1 + (self._verified_draft_len(row, last) if last else 0)
        if tokens:
            self.controller.observe_step(tokens, 1000.0 * (now - self._step_end))

    def _sync_request(
        self, req_id: str, row: int, num_prompt: int, num_tokens: int, num_sampled: int, token_ids_cpu: np.ndarray
    ) -> None:
        """Start the request in the drafter on first sight and extend it with the output it gained since."""
        known = self._known_output.get(req_id)
        num_output = num_tokens - num_prompt
        if known is None or known > num_output:  # new, or preempted and recomputed from a shorter state
            if known is not None:
                self.drafter.stop_request(req_id)
            self.drafter.start_request(
                req_id, token_ids_cpu[row, :num_prompt].copy(), problem_key=self._explicit_problem_key(req_id)
            )
            known = 0
            self._rounds[req_id] = 0
            max_tokens = getattr(getattr(getattr(self._runner, "requests", {}).get(req_id), "sampling_params", None),
                                 "max_tokens", None)
            if isinstance(max_tokens, int) and max_tokens > 0:
                self._max_output[req_id] = max_tokens
        else:
            self._rounds[req_id] = self._rounds.get(req_id, 0) + 1
            # Rows that drafted last round got (accepted + 1) tokens this round.
            last = self._last_draft_len.get(req_id, 0)
            if last > 0:
                verified = self._verified_draft_len(row, last)
                accepted = min(verified, num_sampled - 1)
                self._counters["verified_drafts"] += 1
                self._counters["accepted_tokens"] += accepted
                self.policy.record_acceptance(verified, accepted)
                # Calibrates the drafter's acceptance estimates.
                self.drafter.record_acceptance(req_id, accepted, num_verified=verified)
                if self.budget_source == "controller" and verified:
                    expected = self._expected_kept.pop(req_id, 0.0) * verified / last
                    self.controller.observe_acceptance(expected, accepted)
        if num_output > known:
            self.drafter.extend_request(req_id, token_ids_cpu[row, num_prompt + known : num_tokens].tolist())
        self._known_output[req_id] = num_output

    def _verified_draft_len(self, row: int, proposed: int) -> int:
        """How many of a row's proposed draft tokens this step verified. vLLM's scheduler trims a draft to the
        step's token budget; the model runner records the scheduled draft length per row in
        ``num_decode_draft_tokens`` (vLLM 0.32; -1 for prompt chunks). Without it, the whole draft counts."""
        buf = getattr(self._runner, "num_decode_draft_tokens", None)
        arr = getattr(buf, "np", None)
        if arr is None or row >= len(arr) or int(arr[row]) < 0:
            return proposed
        return min(proposed, int(arr[row]))

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
        if not 0 <= key < 2**63:  # the range add_rollouts accepts for explicit keys
            logger.warning("ignoring %s=%r for request %s: must be in [0, 2**63)", PROBLEM_ID_KEY, value, req_id)
            return None
        return key

    def _finish(self, req_id: str) -> None:
        self._known_output.pop(req_id, None)
        self._last_draft_len.pop(req_id, None)
        self._rounds.pop(req_id, None)
        self._max_output.pop(req_id, None)
        self._expected_kept.pop(req_id, None)
        if req_id in self.drafter.active_requests:
            self.drafter.stop_request(req_id)

    def stats(self) -> dict[str, Any]:
        """Proposer counters merged with the drafter's stats (history size, sources); JSON-serializable.

        Keys: ``attached`` (bool), ``rounds`` (propose calls), ``unattached_rounds`` (calls that proposed nothing
        because :meth:`attach` had not run), ``request_rounds``, ``drafts`` (non-empty drafts), ``draft_tokens``,
        ``accepted_tokens`` (as seen by the proposer: the final draft of each request is never observed),
        ``speculation_seconds`` (time spent in :meth:`propose`), ``budget_source`` (``"controller"`` or
        ``"length_policy"``), ``policy_mode`` (``"controller"`` or the length policy's mode), ``budget_*``: the
        budget source's diagnostics (controller: :meth:`BudgetController.stats` prefixed; length policy:
        ``budget_tier_<short|medium|long>_rounds`` / ``_tokens``, request-rounds and tokens emitted by length tier),
        ``budget_counters`` (which ``budget_*`` keys are cumulative), ``num_speculative_tokens``, ``history_problems``,
        ``history_appearances``, ``history_sequences``, ``history_tokens``, ``history_bytes`` (approximate),
        ``history_evicted_appearances``, ``active_requests``, ``calibration_tokens`` (verified draft tokens the drafter's
        acceptance calibration learned from) and ``source_<name>`` (drafts won by each source).
        """
        controlled = self.budget_source == "controller"
        out: dict[str, Any] = {"attached": self.attached, "num_speculative_tokens": self.num_speculative_tokens,
                               "policy_mode": "controller" if controlled else self.policy.config.mode,
                               "budget_source": self.budget_source}
        out.update(self._counters)
        # The budget source's diagnostics, by prefix; `budget_counters` names the cumulative ones (the trainer logs
        # their per-step differences and the rest as they are).
        if controlled:
            ctl = self.controller.stats()
            out.update({f"budget_{k}": v for k, v in ctl.items()})
            out["budget_counters"] = [f"budget_{k}" for k in BudgetController.COUNTERS]
        else:
            out["budget_counters"] = [k for k in self._counters if k.startswith("budget_")]
        d = self.drafter.stats()
        out.update(
            history_problems=d["problems"],
            history_appearances=d["appearances"],
            history_sequences=d["sequences"],
            history_tokens=d["tokens"],
            history_bytes=d["approx_bytes"] + d["support_table_bytes"],
            history_evicted_appearances=d["evicted_appearances"],
            active_requests=d["active_requests"],
            history_pending_updates=d["pending_updates"],
            history_update_seconds=d["update_seconds"],
            calibration_tokens=d["calibration_tokens"],
        )
        # Which source's candidate won each non-empty draft (per-problem history, running siblings, local, global).
        out.update({f"source_{name}": count for name, count in d["wins"].items()})
        return out

    def reset_counters(self) -> None:
        """Zero the proposer's counters (history is kept)."""
        for key in self._counters:
            self._counters[key] = 0.0 if key == "speculation_seconds" else 0
        self.controller.reset_counters()

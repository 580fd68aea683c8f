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
import threading
import time
from typing import Any

import numpy as np

from das_trl.drafter import DrafterConfig, create_drafter, problem_key
from das_trl.budget import BudgetController, ControllerConfig
from das_trl.drafter.conversation import ConversationKeys

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
        self.engine_dtype = str(getattr(vllm_config.model_config, "dtype", "")).removeprefix("torch.") or None
        self.drafter = create_drafter(DrafterConfig(max_spec_tokens=self.num_speculative_tokens))
        # Per-step budgets from the batch budget controller (drafts to the hard cap, then keeps what pays; see
        # das_trl.budget.controller): the object the replay benchmark uses too.
        self.controller = BudgetController(ControllerConfig())
        self._step_end: float | None = None  # _clock() at the end of the last propose (online cost fit)
        self._clock = time.perf_counter      # seconds; replaceable in tests
        self._runner: Any = None
        # Every request the drafter is tracking has a slot in the per-request arrays below (free slots are reused);
        # the drafter keeps their texts and drafts.
        self._slot_of: dict[str, int] = {}
        self._free_slots: list[int] = []
        self._req = _RequestArrays(256)
        self._seen_totals = (0, 0, 0)  # drafter's acceptance_totals() already counted
        # First prompts of conversations -> problem keys, so later turns draft from their problem (multi-turn).
        self.conversations = ConversationKeys()
        self._conversation_lock = threading.Lock()
        self._counters = dict(
            rounds=0,
            unattached_rounds=0,
            request_rounds=0,
            drafts=0,
            draft_tokens=0,
            accepted_tokens=0,
            verified_drafts=0,
            speculation_seconds=0.0,
        )

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
        for req_id in list(self._slot_of):
            self._finish(req_id)
        if drafter_config is not None:
            if drafter_config != self.drafter.config:
                state = self.drafter.state_dict()
                self.drafter = create_drafter(drafter_config)
                self.drafter.load_state_dict(state)
                self._seen_totals = self.drafter.acceptance_totals()
        if controller_config is not None:
            self.controller = BudgetController(controller_config)
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
            if key not in lengths:  # the conversation's first prompt: later turns extend it
                with self._conversation_lock:
                    self.conversations.register(np.asarray(prompt, dtype=np.int64), key)
            lengths.setdefault(key, []).append(len(comp))
        for key, lens in lengths.items():
            self.controller.observe(key, lens)
        return added

    def detach(self) -> None:
        """Forget the model runner: from the next round on the proposer drafts nothing (history is kept)."""
        for req_id in list(self._slot_of):
            self._finish(req_id)
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
        batch = self._runner.input_batch
        req_ids = batch.req_ids[:n]
        live = set(req_ids)
        for req_id in [r for r in self._slot_of if r not in live]:
            self._finish(req_id)
        num_sampled = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=n)
        rows = np.flatnonzero(num_sampled)  # partial prefills: nothing to extend from yet
        ids = [req_ids[r] for r in rows.tolist()]
        num_tokens = np.asarray(num_tokens_no_spec[:n], dtype=np.int64)[rows]
        num_prompt = np.asarray(batch.num_prompt_tokens[:n], dtype=np.int64)[rows]
        new_rows = [i for i, req_id in enumerate(ids) if req_id not in self._slot_of]
        for i in new_rows:  # first sight of a request
            self._start(ids[i], token_ids_cpu[rows[i], :num_prompt[i]])
        req = self._req
        slots = np.fromiter((self._slot_of[r] for r in ids), dtype=np.int64, count=len(ids))
        req.rounds[slots] += 1
        verified = self._verified_lengths(rows)
        self._observe_verification(slots, num_sampled[rows], verified, started,
                                   complete=not new_rows and len(rows) == n)
        output_len = num_tokens - num_prompt
        caps = np.minimum(self.num_speculative_tokens, self.max_model_len - num_tokens - 1)
        out = self.drafter.step(ids, token_ids_cpu, rows, num_tokens, num_prompt, num_sampled[rows], verified, caps)
        if len(ids):
            # Keep what pays: the drafts were made to the hard cap; the controller cuts them, and the drafter is
            # told what was really sent so verification is accounted against the cut length.
            keep = self.controller.budgets(out.accept, req.key[slots], output_len, req.rounds[slots],
                                           req.max_output[slots])
            out.truncate(keep)
            self.drafter.trim(ids, out.lengths)
            req.expected[slots] = self.controller.last_expected_kept
        req.sent[slots] = out.lengths
        totals = self.drafter.acceptance_totals()
        dd, dv, da = (now - seen for now, seen in zip(totals, self._seen_totals))
        self._seen_totals = totals
        self._counters["verified_drafts"] += dd
        self._counters["accepted_tokens"] += da
        self._counters["request_rounds"] += len(ids)
        self._counters["drafts"] += int(np.count_nonzero(out.lengths))
        self._counters["draft_tokens"] += int(out.lengths.sum())
        drafts: list[list[int]] = [[] for _ in range(n)]
        for i in np.flatnonzero(out.lengths).tolist():  # only rows with a draft become Python lists
            drafts[int(rows[i])] = out.tokens[i, : out.lengths[i]].tolist()
        self._step_end = self._clock()
        self._counters["speculation_seconds"] += self._step_end - started
        return drafts

    def _start(self, req_id: str, prompt: np.ndarray) -> None:
        """Start tracking a request: the drafter's live state, a slot in the per-request arrays, its ``max_tokens``
        (the controller's cap on its remaining length) when vLLM knows it."""
        self.drafter.start_request(req_id, prompt, problem_key=self._request_problem_key(req_id, prompt))
        slot = self._free_slots.pop() if self._free_slots else len(self._slot_of)
        self._req.ensure(slot + 1)
        self._slot_of[req_id] = slot
        request = getattr(self._runner, "requests", {}).get(req_id)
        max_tokens = getattr(getattr(request, "sampling_params", None), "max_tokens", None)
        self._req.reset(slot, self.drafter.problem_of(req_id),
                        max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else self.max_model_len)

    def _observe_verification(self, slots: np.ndarray, num_sampled: np.ndarray, verified: np.ndarray, now: float,
                              complete: bool) -> None:
        """Tell the controller how its last kept drafts fared and, for the online cost fit, how long the step that
        just ran took for how many tokens.

        ``verified``: per row the draft tokens vLLM scheduled (-1: unknown, then the whole draft sent). The step's
        tokens are known only when every row was seen before and none is a partial prefill (``complete``); the
        interval is from the end of the last ``propose`` to ``now`` (forward pass, sampling, scheduling; not the
        drafter's own time)."""
        req = self._req
        sent = req.sent[slots]
        checked = np.where(verified >= 0, np.minimum(sent, verified), sent)
        drafted = sent > 0
        if drafted.any():
            accepted = np.minimum(checked, num_sampled - 1)[drafted]
            expected = (req.expected[slots] * checked / np.maximum(sent, 1))[drafted]
            self.controller.observe_acceptance(float(expected.sum()), int(accepted.sum()))
        if complete and self._step_end is not None and len(slots):
            self.controller.observe_step(int(len(slots) + checked.sum()), 1000.0 * (now - self._step_end))

    def _verified_lengths(self, rows: np.ndarray) -> np.ndarray:
        """How many draft tokens vLLM scheduled (verified) per row this step: the scheduler trims a draft to the
        step's token budget and the model runner records the scheduled length in ``num_decode_draft_tokens``
        (vLLM 0.32; -1 for prompt chunks). -1 where unknown: the drafter then counts the whole draft as sent."""
        buf = getattr(self._runner, "num_decode_draft_tokens", None)
        arr = getattr(buf, "np", None)
        if arr is None:
            return np.full(len(rows), -1, np.int64)
        arr = np.asarray(arr)
        out = np.full(len(rows), -1, np.int64)
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
            key = self.conversations.resolve(prompt)
            if key is None:
                key = problem_key(prompt)
                self.conversations.register(prompt, key)
        return key

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

    def _finish(self, req_id: str) -> None:
        slot = self._slot_of.pop(req_id, None)
        if slot is not None:
            self._free_slots.append(slot)
            self.drafter.stop_request(req_id)

    def stats(self) -> dict[str, Any]:
        """Proposer counters merged with the drafter's stats (history size, sources); JSON-serializable.

        Keys: ``attached`` (bool), ``engine_dtype`` (the dtype the engine's model computes in, e.g. ``"float32"``),
        ``rounds`` (propose calls), ``unattached_rounds`` (calls that proposed nothing
        because :meth:`attach` had not run), ``request_rounds``, ``drafts`` (non-empty drafts), ``draft_tokens``,
        ``accepted_tokens`` (as seen by the proposer: the final draft of each request is never observed),
        ``speculation_seconds`` (time spent in :meth:`propose`), ``budget_*``: the
        budget controller's diagnostics (:meth:`BudgetController.stats` prefixed), ``budget_counters`` (which ``budget_*`` keys are cumulative), ``num_speculative_tokens``, ``history_problems``,
        ``history_appearances``, ``history_sequences``, ``history_tokens``, ``history_bytes`` (approximate),
        ``history_evicted_appearances``, ``active_requests``, ``calibration_tokens`` (verified draft tokens the drafter's
        acceptance calibration learned from), the drafter's live pool (``live_running_tokens``,
        ``live_finished_tokens``, ``live_token_budget``, ``live_evicted_outputs``, ``live_approx_bytes``: see
        ``DASDrafter.stats``), ``conversation_prompts`` / ``conversation_prompts_evicted`` (first prompts known for
        multi-turn keys, at most 65,536) and ``source_<name>`` (drafts won by each source).
        """
        out: dict[str, Any] = {"attached": self.attached, "num_speculative_tokens": self.num_speculative_tokens,
                               "engine_dtype": self.engine_dtype}
        out.update(self._counters)
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
            history_bytes=d["approx_bytes"] + d["support_table_bytes"],
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
        return out

    def reset_history(self) -> None:
        """Drop the drafter's history and live requests (``DASDrafter.reset``). The requests tracked so far are
        forgotten here too: one still running is taken up again at its next round (the drafter catches up from the
        engine's token rows), and one that ended is not stopped twice."""
        self._slot_of.clear()
        self._free_slots.clear()
        self.drafter.reset()
        self._seen_totals = self.drafter.acceptance_totals()

    def reset_counters(self) -> None:
        """Zero the proposer's counters (history is kept)."""
        for key in self._counters:
            self._counters[key] = 0.0 if key == "speculation_seconds" else 0
        self.controller.reset_counters()


class _RequestArrays:
    """Per-request state the proposer keeps between engine steps, as arrays indexed by slot (vectorised per step).

    ``key`` (``int64``: problem key), ``rounds`` (verification rounds so far), ``max_output`` (the request's
    ``max_tokens``, else the model length), ``sent`` (draft tokens sent for verification last step), ``expected``
    (``float64``: the controller's acceptance estimate for them). Grows by doubling; at most as many slots as
    requests ever ran at once."""

    def __init__(self, capacity: int) -> None:
        self.key = np.zeros(capacity, np.int64)
        self.rounds = np.zeros(capacity, np.int64)
        self.max_output = np.zeros(capacity, np.int64)
        self.sent = np.zeros(capacity, np.int64)
        self.expected = np.zeros(capacity, np.float64)

    def ensure(self, size: int) -> None:
        if size > len(self.key):
            cap = max(size, 2 * len(self.key))
            for name in ("key", "rounds", "max_output", "sent", "expected"):
                old = getattr(self, name)
                new = np.zeros(cap, old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)

    def reset(self, slot: int, key: int, max_output: int) -> None:
        self.key[slot] = key
        self.rounds[slot] = -1  # the first step of a request is round 0
        self.max_output[slot] = max_output
        self.sent[slot] = 0
        self.expected[slot] = 0.0

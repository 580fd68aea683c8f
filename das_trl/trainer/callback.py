"""The trainer's own callback and its mirror of the drafter history.

At the end of each optimizer step the step's rollouts go into the drafter history of every engine
(:class:`DASHistoryCallback` calls ``trainer.das_push_history()``; callbacks do not receive the trainer, so
:class:`~das_trl.trainer.DASGRPOTrainer` constructs this one with a reference to itself).

The trainer also keeps :class:`DASHistoryMirror`: the history every engine should hold, built with the same rules as
the engines' (window, token budget, grouping of a step's rollouts by problem, prompt tail). It is what

- checks engines: equal digests (:mod:`das_trl.drafter.digest`) mean an engine holds exactly the pushed history;
- repairs an engine whose push failed or whose history diverged (the whole mirror is loaded into it);
- is saved into each checkpoint (``das_history.npz``, no pickle) and loaded back into every engine on resume.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from transformers import TrainerCallback

from das_trl.drafter import DrafterConfig, RolloutHistory, problem_key
from das_trl.drafter.digest import history_digest
from das_trl.vllm.payload import PayloadError, history_state_from_bytes, history_state_to_bytes

logger = logging.getLogger(__name__)

HISTORY_FILE = "das_history.npz"


class DASHistoryMirror:
    """Trainer-side copy of the history every engine should hold.

    Args:
        window: appearances kept per problem (the engines' ``DrafterConfig.window``).
        token_budget: completion tokens kept (the engines' ``DrafterConfig.history_token_budget``).
        prompt_tail_tokens: prompt tokens kept per appearance (the engines' ``DrafterConfig.prompt_tail_tokens``;
            default: the drafter's default).

    Memory: about 4 bytes per kept completion token plus ~100 bytes per completion (no suffix trees).
    """

    def __init__(self, window: int, token_budget: int, prompt_tail_tokens: int | None = None):
        self.history = RolloutHistory(window, token_budget)
        self.prompt_tail_tokens = (DrafterConfig().prompt_tail_tokens if prompt_tail_tokens is None
                                   else int(prompt_tail_tokens))

    def record(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
               problem_keys: Sequence[int] | None = None) -> None:
        """Add one step's rollouts the way ``DASDrafter.add_rollouts`` does: one appearance per problem (problems in
        order of first rollout), empty completions dropped, the prompt's last ``prompt_tail_tokens`` kept.

        Args:
            prompts, completions: token ids per rollout (``prompts[i]`` pairs with ``completions[i]``).
            problem_keys: explicit key per rollout (``das_problem_id``); ``None``: the hash of each prompt.

        Raises:
            ValueError: mismatched lengths, or token ids outside ``[0, 2**31)``.
        """
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts but {len(completions)} completions")
        if problem_keys is not None and len(problem_keys) != len(prompts):
            raise ValueError(f"got {len(problem_keys)} problem keys for {len(prompts)} rollouts")
        groups: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            p, c = _tokens(prompt), _tokens(completion)
            key = int(problem_keys[i]) if problem_keys is not None else problem_key(p)
            entry = groups.setdefault(key, (p, []))
            if len(c):
                entry[1].append(c)
        for key, (prompt, comps) in groups.items():
            if comps:
                tail = prompt[-self.prompt_tail_tokens:] if self.prompt_tail_tokens else prompt[:0]
                self.history.add(key, comps, tail.copy())

    def digest(self) -> str:
        """:func:`~das_trl.drafter.digest.history_digest` of the mirror."""
        return history_digest(self.history)

    def state(self) -> dict[str, Any]:
        """``RolloutHistory.to_state()`` of the mirror (what ``DASEngine.load_history`` sends)."""
        return self.history.to_state()

    def save(self, directory: str) -> str:
        """Write the mirror to ``directory/das_history.npz`` (written to a temporary name, then renamed).

        Returns:
            the file's path.
        """
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, HISTORY_FILE)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(history_state_to_bytes(self.state()))
        os.replace(tmp, path)
        return path

    def load(self, directory: str) -> bool:
        """Replace the mirror with ``directory/das_history.npz`` if present (this mirror's window and budget apply).

        Returns:
            True if a history file was loaded, False if the checkpoint has none (e.g. saved without DAS).

        Raises:
            ValueError: the file exists but is not a valid history (message names the file).
        """
        path = os.path.join(directory, HISTORY_FILE)
        if not os.path.exists(path):
            return False
        with open(path, "rb") as f:
            data = f.read()
        try:
            state = history_state_from_bytes(data, max_bytes=max(len(data), 1) * 4)
            self.history = RolloutHistory.from_state(state, self.history.window, self.history.token_budget)
        except (PayloadError, ValueError, KeyError) as exc:
            raise ValueError(f"{path} is not a valid DAS history file: {exc}") from None
        return True


def _tokens(ids: Sequence[int]) -> np.ndarray:
    arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= 2**31):
        raise ValueError("token ids must lie in [0, 2**31)")
    return arr.astype(np.int32)


class DASHistoryCallback(TrainerCallback):
    """Calls ``trainer.das_push_history()`` on every ``on_step_end``.

    ``on_step_end`` runs before the trainer logs the step, so the ``das/*`` metrics of the push are logged with it.
    """

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.das_push_history()
        return control

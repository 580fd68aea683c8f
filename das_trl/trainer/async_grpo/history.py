"""``RolloutHistorySync``: the asynchronous rollout worker's side of the drafter history.

The rollout worker records every scored group's rollouts as it finishes them; at each model-version change (the
trainer's weight sync, seen through the worker's shared version counter) it pushes what it recorded since the last
change as one history step, through the same path as :class:`~das_trl.trainer.DASGRPOTrainer`
(:func:`~das_trl.trainer.history_sync.push_history`: one appearance per problem per push, the digest check against its
mirror, a reload when an engine diverged or missed a push, the ``das/*`` metrics). After each push the mirror is
written to ``history_dir`` (``das_history.npz``, the trainer copies it into each checkpoint).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from das_trl.drafter import problem_key
from das_trl.trainer.callback import DASHistoryMirror
from das_trl.trainer.history_sync import push_history
from das_trl.trainer.problem_ids import problem_ids_of
from das_trl.vllm.client import DASEngine

logger = logging.getLogger(__name__)


class RolloutHistorySync:
    """Rollouts recorded between model-version changes, pushed as one history step at each change.

    Args:
        engine: the server's DAS engine client.
        window, token_budget: the engines' history window and token budget (the mirror's rules).
        history_dir: where the mirror is written after each push (``None``: not written).
        restore_dir: a checkpoint folder whose ``das_history.npz`` starts the mirror (resume); ``None``: empty.
        limits: the engine's ``max_model_len`` and ``num_speculative_tokens`` (``das_attach`` reply), for the
            ``das/headroom_short_rows`` count; empty: not counted.

    Raises:
        ValueError: ``restore_dir`` holds a corrupt history file.
    """

    def __init__(self, engine: DASEngine, window: int, token_budget: int, history_dir: str | None = None,
                 restore_dir: str | None = None, limits: dict[str, Any] | None = None):
        self.engine = engine
        self.mirror = DASHistoryMirror(window, token_budget)
        self.history_dir = history_dir
        self.limits = dict(limits or {})
        if restore_dir:
            if self.mirror.load(restore_dir):
                logger.info("DAS history restored from %s", restore_dir)
            else:
                logger.warning("checkpoint %s has no DAS history: drafting restarts from an empty history", restore_dir)
        self.stale = True  # the engine may hold another run's history: the first push loads the mirror
        self.last_counters: dict[str, float] = {}
        # (prompt ids, completion ids, explicit key or None) per rollout, recorded since the last push.
        self._pending: list[tuple[list[int], list[int], int | None]] = []
        self._short_rows = 0
        self._lock = threading.Lock()  # record_group runs on the worker's event loop, push on a thread

    def record_group(self, sequences: list[list[Any]], reward_kwargs: dict[str, list[Any]]) -> None:
        """Record one scored group's rollouts.

        Args:
            sequences: per conversation, its training rows (TRL's ``TrainingSequence``: ``input_ids``,
                ``completion_mask``); the first row gives the prompt (the tokens before the first trained one) and the
                completion (everything after it, tool results of a multi-turn conversation included). A conversation
                without a trained token is skipped.
            reward_kwargs: the group's dataset columns, one value per conversation; a ``das_problem_id`` column keys
                the rollouts by that id (:mod:`das_trl.trainer.problem_ids`).
        """
        explicit = problem_ids_of([{k: v[i] for k, v in reward_kwargs.items()} for i in range(len(sequences))])
        k = int(self.limits.get("num_speculative_tokens") or 0)
        max_model_len = self.limits.get("max_model_len")
        recorded, short = [], 0
        for i, rows in enumerate(sequences):
            if not rows or 1 not in rows[0].completion_mask:
                continue
            ids, start = list(rows[0].input_ids), list(rows[0].completion_mask).index(1)
            recorded.append((ids[:start], ids[start:], explicit[i] if explicit is not None else None))
            short += bool(max_model_len and len(ids) + k > max_model_len)
        with self._lock:
            self._pending += recorded
            self._short_rows += short

    def push(self) -> dict[str, float]:
        """Push the rollouts recorded since the last push as one history step, check the engine, write the mirror.

        Returns:
            the ``das/*`` metrics of the push (a failed push: ``das/history_push_failures``; the next one reloads).
        """
        with self._lock:
            pending, self._pending = self._pending, []
            short_rows, self._short_rows = self._short_rows, 0
        prompts = [p for p, _, _ in pending]
        completions = [c for _, c, _ in pending]
        explicit = any(key is not None for _, _, key in pending)
        keys = [key if key is not None else problem_key(p) for p, _, key in pending] if explicit else None
        if prompts:
            self.mirror.record(prompts, completions, keys)
        metrics, self.stale = push_history(self.engine, self.mirror, prompts, completions, keys, stale=self.stale,
                                           last_counters=self.last_counters)
        metrics["das/history_rollouts"] = float(len(prompts))
        if self.limits.get("max_model_len"):
            metrics["das/headroom_short_rows"] = float(short_rows)
        if self.history_dir:
            self.mirror.save(self.history_dir)
        return metrics


def history_dir_of(output_dir: str) -> str:
    """Where the rollout worker keeps its mirror of the drafter history: ``<output_dir>/das_history``."""
    return os.path.abspath(os.path.join(output_dir, "das_history"))

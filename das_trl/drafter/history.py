"""Rollout history: per-problem sliding window of appearances under a token budget.

DAS paper (arXiv 2511.13841), "rollout history": RL revisits the same prompts each
epoch, so the recent completions of a problem predict its next ones; a window of the
last W appearances tracks policy drift, and a global token budget bounds memory.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import numpy as np

_STATE_VERSION = 1
_STATE_FIELDS = ("version", "window", "token_budget", "next_id", "evicted_appearances", "appearance_ids",
                 "problem_keys", "num_seqs", "seq_lens", "tokens", "tail_lens", "tails")


@dataclass
class Appearance:
    """One problem's completions from one push (one GRPO step: its group of siblings).

    Attributes:
        appearance_id: unique, increasing in push order (int).
        problem_key: the problem's key (int in ``[0, 2**63)``).
        completions: list of 1-D ``np.int32`` arrays, one per non-empty completion.
        prompt_tail: 1-D ``np.int32`` array, last prompt tokens (may be empty).
        num_tokens: total completion tokens (int).
    """

    appearance_id: int
    problem_key: int
    completions: list[np.ndarray]
    prompt_tail: np.ndarray
    num_tokens: int


class RolloutHistory:
    """Per problem, the last ``window`` appearances; oldest-first eviction over budget.

    Args:
        window: appearances kept per problem (int >= 1).
        token_budget: total completion tokens kept across all problems (int >= 1).
            A single appearance larger than the budget is still kept (the newest
            appearance is never evicted by its own insertion).

    Not thread-safe: the owner (``DASDrafter``) serializes access.
    """

    def __init__(self, window: int = 16, token_budget: int = 8_000_000) -> None:
        if window < 1 or token_budget < 1:
            raise ValueError(f"window and token_budget must be >= 1, got {window}, {token_budget}")
        self.window = int(window)
        self.token_budget = int(token_budget)
        self._problems: dict[int, deque[Appearance]] = {}
        # Push order over all problems; entries may be stale (already window-evicted),
        # they are skipped lazily when budget eviction pops from the left.
        self._fifo: deque[int] = deque()  # appearance ids, so stale entries hold no data
        self._live: dict[int, Appearance] = {}
        self._tokens = 0
        self._sequences = 0
        self._next_id = 0
        self.evicted_appearances = 0

    # ------------------------------------------------------------------ mutation
    def add(self, problem_key: int, completions: Sequence[np.ndarray],
            prompt_tail: np.ndarray | None = None) -> list[tuple[int, int]]:
        """Append one appearance of ``problem_key`` and evict what falls out.

        Args:
            problem_key: int in ``[0, 2**63)``.
            completions: 1-D ``np.int32`` arrays (validated by the caller; empty ones
                are dropped). Arrays are stored by reference, not copied.
            prompt_tail: optional 1-D ``np.int32`` array of the last prompt tokens.

        Returns:
            ``[(problem_key, appearance_id), ...]`` evicted by this call (window first,
            then budget, oldest first). If every completion is empty nothing is added
            and ``[]`` is returned.
        """
        comps = [c for c in completions if len(c) > 0]
        if not comps:
            return []
        tail = np.zeros(0, np.int32) if prompt_tail is None else prompt_tail
        app = Appearance(self._next_id, int(problem_key), comps, tail,
                         int(sum(len(c) for c in comps)))
        self._next_id += 1
        dq = self._problems.setdefault(app.problem_key, deque())
        dq.append(app)
        self._fifo.append(app.appearance_id)
        self._live[app.appearance_id] = app
        self._tokens += app.num_tokens
        self._sequences += len(comps)
        evicted: list[tuple[int, int]] = []
        while len(dq) > self.window:
            evicted.append(self._drop(dq[0]))
        while self._tokens > self.token_budget:
            oldest = self._live.get(self._fifo[0])
            if oldest is None:
                self._fifo.popleft()
                continue
            if oldest is app:
                break
            evicted.append(self._drop(oldest))
        if len(self._fifo) > 2 * len(self._live) + 1024:
            # Window evictions leave stale ids behind; compact so the deque stays O(live).
            self._fifo = deque(i for i in self._fifo if i in self._live)
        return evicted

    def _drop(self, app: Appearance) -> tuple[int, int]:
        dq = self._problems[app.problem_key]
        # Appearances leave a problem's deque in push order, so it is always the left end.
        assert dq[0] is app
        dq.popleft()
        if not dq:
            del self._problems[app.problem_key]
        if self._fifo and self._fifo[0] == app.appearance_id:
            self._fifo.popleft()
        del self._live[app.appearance_id]
        self._tokens -= app.num_tokens
        self._sequences -= len(app.completions)
        self.evicted_appearances += 1
        return app.problem_key, app.appearance_id

    def clear(self) -> None:
        """Drop everything (counters included)."""
        self.__init__(self.window, self.token_budget)

    # ------------------------------------------------------------------ queries
    def appearance(self, appearance_id: int) -> Appearance:
        """Return a live appearance. Raises ``KeyError`` if unknown or evicted."""
        return self._live[appearance_id]

    def appearances(self, problem_key: int | None = None) -> Iterator[Appearance]:
        """Iterate live appearances in push order (of one problem, or of all)."""
        if problem_key is not None:
            yield from list(self._problems.get(problem_key, ()))
            return
        for app_id in list(self._fifo):
            app = self._live.get(app_id)
            if app is not None:
                yield app

    def problems(self) -> list[int]:
        """Keys of problems with at least one live appearance."""
        return list(self._problems)

    def lengths(self, problem_key: int) -> np.ndarray:
        """Completion lengths (tokens, ``np.int64`` 1-D, oldest first) seen for a problem
        within the window; empty if unknown. Input for a length-aware policy."""
        apps = self._problems.get(problem_key, ())
        return np.asarray([len(c) for a in apps for c in a.completions], dtype=np.int64)

    @property
    def last_appearance_id(self) -> int:
        """Id given to the most recent appearance (-1 before any)."""
        return self._next_id - 1

    @property
    def num_tokens(self) -> int:
        """Completion tokens currently kept."""
        return self._tokens

    def stats(self) -> dict:
        """Return ``{problems, appearances, sequences, tokens, approx_bytes,
        evicted_appearances}``; ``approx_bytes`` counts token storage (4 B/token)."""
        return {
            "problems": len(self._problems),
            "appearances": len(self._live),
            "sequences": self._sequences,
            "tokens": self._tokens,
            "approx_bytes": 4 * self._tokens,
            "evicted_appearances": self.evicted_appearances,
        }

    # ------------------------------------------------------------------ persistence
    def to_state(self) -> dict:
        """Serialize to a dict of numpy arrays and ints (``np.savez``-friendly, no pickle).

        Keys: ``version, window, token_budget, next_id, evicted_appearances`` (ints);
        ``appearance_ids, problem_keys`` (int64 / uint64, push order); ``num_seqs``
        (int64, completions per appearance); ``seq_lens`` (int64); ``tokens`` (int32,
        all completions concatenated); ``tail_lens`` (int64); ``tails`` (int32).
        """
        apps = list(self.appearances())
        comps = [c for a in apps for c in a.completions]
        cat = (lambda xs: np.concatenate(xs).astype(np.int32) if xs else np.zeros(0, np.int32))
        return {
            "version": _STATE_VERSION,
            "window": self.window,
            "token_budget": self.token_budget,
            "next_id": self._next_id,
            "evicted_appearances": self.evicted_appearances,
            "appearance_ids": np.asarray([a.appearance_id for a in apps], dtype=np.int64),
            "problem_keys": np.asarray([a.problem_key for a in apps], dtype=np.uint64),
            "num_seqs": np.asarray([len(a.completions) for a in apps], dtype=np.int64),
            "seq_lens": np.asarray([len(c) for c in comps], dtype=np.int64),
            "tokens": cat(comps),
            "tail_lens": np.asarray([len(a.prompt_tail) for a in apps], dtype=np.int64),
            "tails": cat([a.prompt_tail for a in apps]),
        }

    @classmethod
    def from_state(cls, state: dict, window: int | None = None,
                   token_budget: int | None = None) -> "RolloutHistory":
        """Rebuild from :meth:`to_state` output.

        Args:
            state: the dict (values may be numpy 0-d arrays, as after ``np.load``).
            window, token_budget: override the saved limits; if smaller, the restored
                history is trimmed by the normal eviction rules.

        Raises:
            ValueError: not a mapping, missing fields, unknown ``version`` or inconsistent array sizes.
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"history state must be a mapping (from RolloutHistory.to_state), got "
                             f"{type(state).__name__}")
        missing = [k for k in _STATE_FIELDS if k not in state]
        if missing:
            raise ValueError(f"history state lacks {missing} (not from RolloutHistory.to_state?)")
        if int(state["version"]) != _STATE_VERSION:
            raise ValueError(f"unsupported history state version {state['version']}")
        hist = cls(int(window if window is not None else state["window"]),
                   int(token_budget if token_budget is not None else state["token_budget"]))
        num_seqs = np.asarray(state["num_seqs"], dtype=np.int64)
        seq_lens = np.asarray(state["seq_lens"], dtype=np.int64)
        tail_lens = np.asarray(state["tail_lens"], dtype=np.int64)
        tokens = np.asarray(state["tokens"], dtype=np.int32)
        tails = np.asarray(state["tails"], dtype=np.int32)
        ids = np.asarray(state["appearance_ids"], dtype=np.int64)
        keys = np.asarray(state["problem_keys"], dtype=np.uint64)
        if (len(ids) != len(keys) or len(ids) != len(num_seqs) or len(ids) != len(tail_lens)
                or int(num_seqs.sum()) != len(seq_lens) or int(seq_lens.sum()) != len(tokens)
                or int(tail_lens.sum()) != len(tails)):
            raise ValueError("inconsistent history state arrays")
        seq_off = np.concatenate([[0], np.cumsum(seq_lens)])
        tail_off = np.concatenate([[0], np.cumsum(tail_lens)])
        s = 0
        for i in range(len(ids)):
            # Copies: writeable arrays independent of the state buffers (arctic needs writeable).
            comps = [tokens[seq_off[j]:seq_off[j + 1]].copy() for j in range(s, s + int(num_seqs[i]))]
            s += int(num_seqs[i])
            hist._next_id = int(ids[i])
            hist.add(int(keys[i]), comps, tails[tail_off[i]:tail_off[i + 1]].copy())
        hist._next_id = max(hist._next_id, int(state["next_id"]))
        hist.evicted_appearances += int(state["evicted_appearances"])
        return hist


def history_state(drafter_state: object) -> Mapping:
    """The ``"history"`` entry of a drafter's ``state_dict()``.

    Raises:
        ValueError: ``drafter_state`` is not a mapping with a ``"history"`` entry.
    """
    if not isinstance(drafter_state, Mapping) or "history" not in drafter_state:
        got = sorted(map(str, drafter_state)) if isinstance(drafter_state, Mapping) else type(drafter_state).__name__
        raise ValueError(f"drafter state must be a mapping with a 'history' entry (from state_dict()), got {got}")
    return drafter_state["history"]

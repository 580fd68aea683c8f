"""Problem keys for multi-turn and tool-calling rollouts: a later turn belongs to its conversation's first prompt.

A GRPO problem's key is the hash of its prompt ids (``problem_key.py``). In multi-turn / tool-calling GRPO (TRL's
``_tool_call_loop``, trl 1.16), a later turn is generated from ``first prompt + earlier turns + tool output`` as a new
engine request with ``n = 1``; hashed on its own, that prompt is a key no history was ever pushed under, so the
problem's history and siblings stopped drafting after the first turn. :class:`ConversationKeys` maps such a prompt
back to its conversation:

* **register** ``(prompt, key)``: every history push registers each rollout's (first-turn) prompt with the key its
  history went under (an explicit ``das_problem_id`` included), and a request whose prompt resolves to nothing
  registers its own prompt with its prompt hash (the first turn of a problem not pushed yet);
* **resolve** ``prompt``: the key of the *longest registered prompt that equals or prefixes it*; ``None`` if none does.

So a conversation's turns all draft from the problem's history and siblings, keyed by what the trainer pushed.
Registered prompts are held as (length, 64-bit polynomial prefix hash) pairs, not tokens: a hash collision can only
make a request draft from another problem's trees (drafts are verified, outputs never change). At most
``max_prompts`` prompts are kept, least recently used first out (``stats()``).

A GRPO generation starts each prompt ``num_generations`` times (vLLM fans ``n`` out into sibling requests), so
``resolve`` remembers which registered prompt a prompt's exact bytes resolved to (at most ``max_memo`` prompts and
``max_memo_bytes`` of their bytes): the siblings after the first skip the prefix hashes (~10 -> ~2 us per request
start). The memo is dropped whenever a new prompt is registered (it could be a longer prefix), and a remembered
prompt evicted since is resolved afresh, so a memo hit returns what the full resolution would.

Limits (docs/troubleshooting.md): a dataset whose prompts are prefixes of other dataset prompts (e.g. conversation
prefixes as separate rows) maps the longer prompt's requests to the shorter problem until the longer one's rollouts
are pushed once; explicit ids registered by a push are known from the next step on, and after an engine restart
from the next push on.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from das_trl.drafter.problem_key import problem_key

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier; arithmetic wraps mod 2**64


class ConversationKeys:
    """Registered first-turn prompts -> problem keys, resolved by longest prefix.

    Args:
        max_prompts: most prompts kept (int >= 1); the least recently registered or resolved one is dropped first.
        max_memo: most resolved prompts remembered by their bytes (int >= 0; 0: no memo); the memo is emptied when
            full.
        max_memo_bytes: most bytes of remembered prompts (int >= 0; default 16 MiB): long multi-turn prompts fill it
            before ``max_memo`` does; a prompt larger than it is not remembered.

    Memory: about 200 bytes per registered prompt (a dict entry and its key), whatever the prompt's length; the
    prefix-hash powers table is 8 bytes per token of the longest prompt seen; the memo holds at most ``max_memo``
    prompts and ``max_memo_bytes`` of their bytes (4 per token of an int32 prompt;
    ``stats()["conversation_memo_bytes"]``).

    Not thread-safe (the owner locks).

    Raises:
        ValueError: ``max_prompts < 1``, ``max_memo < 0`` or ``max_memo_bytes < 0``.
    """

    def __init__(self, max_prompts: int = 65_536, max_memo: int = 4096, max_memo_bytes: int = 16 << 20) -> None:
        if not isinstance(max_prompts, int) or isinstance(max_prompts, bool) or max_prompts < 1:
            raise ValueError(f"max_prompts must be an int >= 1, got {max_prompts!r}")
        if not isinstance(max_memo, int) or isinstance(max_memo, bool) or max_memo < 0:
            raise ValueError(f"max_memo must be an int >= 0, got {max_memo!r}")
        if not isinstance(max_memo_bytes, int) or isinstance(max_memo_bytes, bool) or max_memo_bytes < 0:
            raise ValueError(f"max_memo_bytes must be an int >= 0, got {max_memo_bytes!r}")
        self.max_prompts = max_prompts
        self.max_memo = max_memo
        self.max_memo_bytes = max_memo_bytes
        self._memo: dict[tuple[str, bytes], tuple[int, int]] = {}  # prompt (dtype, bytes) -> the entry it resolved to
        self._memo_bytes = 0
        self._entries: OrderedDict[tuple[int, int], int] = OrderedDict()  # (length, prefix hash) -> key, LRU order
        self._lengths: dict[int, int] = {}  # prompt length -> registered prompts of that length
        self._powers = np.ones(1, np.uint64)
        self._evicted = 0

    def _prefix_hashes(self, prompt: np.ndarray) -> np.ndarray:
        """``uint64 [len(prompt) + 1]``: element ``i`` hashes ``prompt[:i]`` (sum of ``(t_j + 1) * B**j`` mod 2**64)."""
        n = len(prompt)
        if len(self._powers) < n:
            grow = np.full(n - len(self._powers) + 1, _BASE, np.uint64)
            grow[0] = self._powers[-1]
            self._powers = np.concatenate([self._powers[:-1], np.cumprod(grow, dtype=np.uint64)])
        out = np.zeros(n + 1, np.uint64)
        with np.errstate(over="ignore"):
            np.cumsum((prompt.astype(np.uint64) + np.uint64(1)) * self._powers[:n], out=out[1:], dtype=np.uint64)
        return out

    def resolve(self, prompt: np.ndarray) -> int | None:
        """The key of the longest registered prompt equal to or a prefix of ``prompt`` (1-D int array); ``None`` when
        none is. A hit counts as a use (least-recently-used order)."""
        n = len(prompt)
        if not self._entries or n == 0:
            return None
        memo_key = (prompt.dtype.str, prompt.tobytes()) if self.max_memo else None
        entry = self._memo.get(memo_key) if memo_key is not None else None
        if entry is not None:
            key = self._entries.get(entry)
            if key is not None:  # still registered (no newer prompt since: registering one empties the memo)
                self._entries.move_to_end(entry)
                return key
        hashes = self._prefix_hashes(prompt)
        for length in sorted((ln for ln in self._lengths if ln <= n), reverse=True):
            entry = (length, int(hashes[length]))
            key = self._entries.get(entry)
            if key is not None:
                self._entries.move_to_end(entry)
                if memo_key is not None:
                    self._remember(memo_key, entry)
                return key
        return None

    def key_of(self, prompt: np.ndarray) -> int:
        """A new request's problem key: :meth:`resolve`'s, else the prompt's hash (:func:`problem_key`), which is then
        registered as a conversation's first prompt (what ``DASProposer`` does when a request starts without an
        explicit ``das_problem_id``). ``prompt``: 1-D int array. Raises ``ValueError`` (ids outside ``[0, 2**31)``)."""
        key = self.resolve(prompt)
        if key is None:
            key = problem_key(prompt)
            self.register(prompt, key)
        return key

    def register(self, prompt: np.ndarray, key: int) -> None:
        """Map ``prompt`` (1-D int array, non-empty) to ``key`` (replacing an earlier key of the same prompt); drops
        the least recently used prompt beyond ``max_prompts``. An empty prompt is ignored."""
        n = len(prompt)
        if n == 0:
            return
        entry = (n, int(self._prefix_hashes(prompt)[n]))
        if entry not in self._entries:
            self._lengths[n] = self._lengths.get(n, 0) + 1
            self._clear_memo()  # a new prompt may be a longer prefix of a remembered one
            if self.max_memo:  # the prompt itself resolves to its own entry (no registered prefix is longer)
                self._remember((prompt.dtype.str, prompt.tobytes()), entry)
        self._entries[entry] = int(key)
        self._entries.move_to_end(entry)
        while len(self._entries) > self.max_prompts:
            (length, _), _ = self._entries.popitem(last=False)
            self._evicted += 1
            left = self._lengths[length] - 1
            if left:
                self._lengths[length] = left
            else:
                del self._lengths[length]

    def _remember(self, memo_key: tuple[str, bytes], entry: tuple[int, int]) -> None:
        size = len(memo_key[1])
        if size > self.max_memo_bytes:
            return
        if len(self._memo) >= self.max_memo or self._memo_bytes + size > self.max_memo_bytes:
            self._clear_memo()
        self._memo[memo_key] = entry
        self._memo_bytes += size

    def _clear_memo(self) -> None:
        if self._memo:
            self._memo.clear()
            self._memo_bytes = 0

    def clear(self) -> None:
        """Forget every registered prompt."""
        self._entries.clear()
        self._lengths.clear()
        self._clear_memo()

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict:
        """``{"conversation_prompts": registered prompts, "conversation_prompts_evicted": dropped by max_prompts,
        "conversation_memo": prompts remembered by their bytes, "conversation_memo_bytes": their bytes}``."""
        return {"conversation_prompts": len(self._entries), "conversation_prompts_evicted": self._evicted,
                "conversation_memo": len(self._memo), "conversation_memo_bytes": self._memo_bytes}

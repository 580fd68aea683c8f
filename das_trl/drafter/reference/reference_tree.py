"""A pure-Python suffix tree with arctic-inference's ``SuffixTree`` interface: the executable specification of what
the native core (``das_trl/drafter/native``) computes, for tests.

It keeps, per appended token, up to ``max_depth`` active suffixes (an uncompressed trie truncated at ``max_depth``,
as arctic's tree is), so a node's count is the number of occurrences of its string. ``speculate`` follows arctic's
path mode exactly, float32 arithmetic included (arctic ``csrc/suffix_decoding/suffix_tree.cc``): every match length
m = 1 .. (longest suffix of the context in the tree, m < len(context)) drafts the most frequent path, at most
``min(max_spec_tokens, int(m * max_spec_factor + max_spec_offset + 1e-6))`` tokens, stopping when the product of
count ratios falls below ``min_token_prob``; the draft with the largest float32 sum of probabilities wins, the longer
match on ties. One difference, by design: among equally frequent continuations arctic takes whichever its hash map
yields first, this tree (and the native core) the smallest token id.

O(max_depth) Python work per token: for tests and small replays only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


@dataclass
class ReferenceDraft:
    """arctic's ``Draft`` fields used by the drafter: token ids, cumulative probabilities (float32 values as Python
    floats), the chosen match length and the float32 score."""

    token_ids: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_len: int = 0
    score: float = 0.0


class ReferenceSuffixTree:
    """Suffix tree of several sequences, truncated at ``max_depth`` (arctic ``SuffixTree`` interface subset).

    Args:
        max_depth: longest string kept (int >= 1).
    """

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = int(max_depth)
        self._root = _Node()
        self._seqs: dict[int, list[int]] = {}
        self._active: dict[int, list[_Node]] = {}

    def num_seqs(self) -> int:
        """Sequences holding at least one token."""
        return len(self._seqs)

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Append tokens to a sequence (created on first use)."""
        for t in tokens:
            self._append(int(seq_id), int(t))

    extend_ndarray = extend

    def _append(self, seq_id: int, token: int) -> None:
        seq = self._seqs.setdefault(seq_id, [])
        active = self._active.setdefault(seq_id, [])
        active.append(self._root)
        self._root.count += 1
        if len(active) > self.max_depth:
            active.pop(0)
        seq.append(token)
        for i, node in enumerate(active):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            active[i] = child

    def remove(self, seq_id: int) -> None:
        """Remove a sequence (unknown ids are ignored)."""
        seq = self._seqs.pop(int(seq_id), None)
        self._active.pop(int(seq_id), None)
        if seq is None:
            return
        for start in range(len(seq)):
            self._root.count -= 1
            node = self._root
            for t in seq[start:start + self.max_depth]:
                child = node.children[t]
                child.count -= 1
                if child.count == 0:
                    del node.children[t]
                    break
                node = child

    def _match(self, context: Sequence[int]) -> _Node | None:
        node = self._root
        for t in context:
            node = node.children.get(int(t))
            if node is None:
                return None
        return node

    def speculate(self, context: Sequence[int], max_spec_tokens: int, max_spec_factor: float,
                  max_spec_offset: float, min_token_prob: float, use_tree_spec: bool = False) -> ReferenceDraft:
        """arctic's ``speculate`` in path mode (see the module docstring). ``use_tree_spec`` must be False."""
        if use_tree_spec:
            raise ValueError("ReferenceSuffixTree implements path speculation only")
        f32 = np.float32
        factor, offset, min_prob = f32(max_spec_factor), f32(max_spec_offset), f32(min_token_prob)
        ctx = [int(t) for t in context]
        best = ReferenceDraft()
        best_score = f32(0.0)
        for m in range(1, len(ctx)):
            node = self._match(ctx[len(ctx) - m:])
            if node is None:
                break
            max_tokens = max(0, min(int(max_spec_tokens), int(float(f32(m) * factor + offset) + 1e-6)))
            tokens, probs, score, prob = [], [], f32(0.0), f32(1.0)
            while len(tokens) < max_tokens and prob >= min_prob and node.children:
                tok, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
                prob = f32(prob * (f32(child.count) / f32(node.count)))
                if not prob >= min_prob:
                    break
                tokens.append(tok)
                probs.append(float(prob))
                score = f32(score + prob)
                node = child
            if score >= best_score:
                best = ReferenceDraft(tokens, probs, m, float(score))
                best_score = score
        return best

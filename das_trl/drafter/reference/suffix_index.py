"""Suffix trees over the rollout history: one per problem, plus one global tree.

DAS (arXiv 2511.13841), "suffix-tree drafter": a problem's windowed history predicts
its next rollouts; a global tree over all history is the fallback for problems with no
history (first epoch). Trees are arctic-inference's C++ ``SuffixTree``; sequences enter
and leave as appearances enter and leave the history window (``remove(seq_id)``).
Each tree sequence is ``prompt_tail + completion`` so that the first output tokens,
whose context is the prompt's end, can be drafted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..config import DrafterConfig
from ..history import Appearance
from .arbitration import Candidate
from .arctic import suffix_tree
from .support import GLOBAL_SCOPE, SupportTable, scope_salt

if TYPE_CHECKING:
    from .arctic import SuffixTree


@dataclass
class _Indexed:
    app: Appearance
    seq_ids: list[int]
    # Extra copies of the sequences in the problem tree while this is the problem's newest appearance (recency weight).
    recent_ids: list[int] = field(default_factory=list)


class HistoryIndex:
    """Per-problem and global suffix trees plus support counts over the history.

    Args:
        config: the drafter config (``max_tree_depth``, ``use_problem_tree``,
            ``use_global_tree``, ``support_ngram``, ``support_table_bits``,
            speculation limits).

    Cost: inserting a token costs O(max_tree_depth) in each tree it enters; every
    completion enters its problem tree, ``global_samples_per_appearance`` of each
    appearance also enter the global tree. Not thread-safe (caller locks).
    """

    # Tokens inserted between two ``pause`` calls (~0.2-2 ms of tree work at depth 24-64).
    chunk_tokens = 256

    def __init__(self, config: DrafterConfig, tree_factory: Callable[[int], SuffixTree] | None = None) -> None:
        self.cfg = config
        self._tree = tree_factory if tree_factory is not None else suffix_tree()
        self._problem_trees: dict[int, SuffixTree] = {}
        self._global = self._tree(config.max_tree_depth) if config.use_global_tree else None
        self._support = SupportTable(config.support_table_bits)
        self._apps: dict[int, _Indexed] = {}
        self._newest: dict[int, int] = {}  # problem key -> appearance id holding the recency copies
        self._next_seq = 0

    def _sequences(self, app: Appearance) -> list[np.ndarray]:
        # Fresh writeable int32 arrays: arctic's extend_ndarray rejects read-only input.
        tail = app.prompt_tail[-self.cfg.prompt_tail_tokens:] if self.cfg.prompt_tail_tokens \
            else app.prompt_tail[:0]
        return [np.concatenate([tail, c]).astype(np.int32, copy=False) for c in app.completions]

    def _global_count(self, app: Appearance) -> int:
        if self._global is None:
            return 0
        k = self.cfg.global_samples_per_appearance
        return len(app.completions) if k == 0 else min(k, len(app.completions))

    def _keys(self, app: Appearance, seqs: list[np.ndarray]) -> np.ndarray:
        # Support keys mirror tree contents: problem scope for every sequence of the
        # appearance, global scope only for those that entered the global tree.
        n_global = self._global_count(app)
        problem = [scope_salt(app.problem_key)] if self.cfg.use_problem_tree else []
        keys = []
        for i, seq in enumerate(seqs):
            salts = problem + ([GLOBAL_SCOPE] if i < n_global else [])
            if salts:
                keys.append(SupportTable.sequence_keys(seq, self.cfg.support_ngram, salts))
        return np.concatenate(keys) if keys else np.zeros(0, np.uint64)

    def insert(self, apps: list[Appearance], pause: Callable[[], None] | None = None) -> None:
        """Add appearances (already in the history) to the trees and support counts.

        Args:
            apps: appearances to index.
            pause: called after every ``chunk_tokens``-token piece of tree insertion; a background updater passes a
                function that releases the drafter lock for a moment, so ``propose`` never waits for a whole
                history step (arctic 0.3's ``extend`` holds the GIL, so the pieces must be small).
        """
        chunk = self.chunk_tokens
        for app in apps:
            seqs = self._sequences(app)
            n_global = self._global_count(app)
            seq_ids = []
            tree = None
            if self.cfg.use_problem_tree:
                tree = self._problem_trees.get(app.problem_key)
                if tree is None:
                    tree = self._problem_trees[app.problem_key] = self._tree(self.cfg.max_tree_depth)
            for i, seq in enumerate(seqs):
                sid = self._new_seq_id()
                seq_ids.append(sid)
                targets = ([tree] if tree is not None else []) + ([self._global] if i < n_global else [])
                for start in range(0, len(seq), chunk):
                    piece = seq[start:start + chunk]  # extending a seq id appends to it
                    for t in targets:
                        t.extend_ndarray(sid, piece)
                    if pause is not None:
                        pause()
            entry = self._apps[app.appearance_id] = _Indexed(app, seq_ids)
            self._support.add(self._keys(app, seqs), +1)
            if tree is not None and self.cfg.recent_appearance_weight > 1:
                self._move_recency_copies(tree, entry, seqs, pause)

    def _new_seq_id(self) -> int:
        sid = self._next_seq
        self._next_seq = (self._next_seq + 1) & 0x7FFFFFFF  # arctic ids are int32
        return sid

    def _move_recency_copies(self, tree: SuffixTree, entry: _Indexed, seqs: list[np.ndarray],
                             pause: Callable[[], None] | None) -> None:
        """Give the problem's newest appearance ``recent_appearance_weight - 1`` extra copies in its problem tree (so
        its continuations weigh more in the tree's counts: the paper down-weights older epochs) and drop the copies
        of the appearance that was newest before."""
        key = entry.app.problem_key
        old = self._apps.get(self._newest.get(key, -1))
        if old is not None:
            for sid in old.recent_ids:
                tree.remove(sid)
                if pause is not None:
                    pause()
            old.recent_ids = []
        for _ in range(self.cfg.recent_appearance_weight - 1):
            for seq in seqs:
                sid = self._new_seq_id()
                entry.recent_ids.append(sid)
                for start in range(0, len(seq), self.chunk_tokens):
                    tree.extend_ndarray(sid, seq[start:start + self.chunk_tokens])
                    if pause is not None:
                        pause()
        self._newest[key] = entry.app.appearance_id

    def remove(self, appearance_ids: list[int], pause: Callable[[], None] | None = None) -> None:
        """Remove appearances (by id) from trees and counts; unknown ids are ignored. ``pause`` as in
        :meth:`insert`, called after each removed sequence."""
        for app_id in appearance_ids:
            entry = self._apps.pop(app_id, None)
            if entry is None:
                continue
            tree = self._problem_trees.get(entry.app.problem_key)
            n_global = self._global_count(entry.app)
            for i, sid in enumerate(entry.seq_ids):
                if tree is not None:
                    tree.remove(sid)
                if i < n_global:
                    self._global.remove(sid)
                if pause is not None:
                    pause()
            for sid in entry.recent_ids:
                if tree is not None:
                    tree.remove(sid)
            if self._newest.get(entry.app.problem_key) == app_id:
                del self._newest[entry.app.problem_key]
            if tree is not None and tree.num_seqs() == 0:
                del self._problem_trees[entry.app.problem_key]
            self._support.add(self._keys(entry.app, self._sequences(entry.app)), -1)

    def candidates(self, problem_key: int, context: list[int], max_tokens: int) -> list[Candidate]:
        """Drafts from the problem tree and the global tree (in that order).

        Args:
            problem_key: the request's problem.
            context: tail of the request's context (list of int, <= max_tree_depth).
            max_tokens: draft cap for this round (int >= 1).

        Returns:
            Non-empty candidates with ``support`` filled; not yet evaluated.
        """
        out = []
        cfg = self.cfg
        g1 = cfg.support_ngram - 1
        sources = []
        if cfg.use_problem_tree and problem_key in self._problem_trees:
            sources.append(("problem", self._problem_trees[problem_key], scope_salt(problem_key)))
        if self._global is not None:
            sources.append(("global", self._global, GLOBAL_SCOPE))
        for name, tree, salt in sources:
            d = tree.speculate(context, max_tokens, cfg.max_spec_factor, cfg.max_spec_offset,
                               cfg.min_token_prob, False)
            if not d.token_ids or d.match_len < cfg.min_match_len:
                continue
            tokens = list(d.token_ids)
            support = self._support.count(context[-g1:] + tokens[:1], salt)
            out.append(Candidate(name, tokens, list(d.probs), int(d.match_len), support))
        return out

    def stats(self) -> dict:
        """``{problem_trees, global_seqs, support_table_bytes}``."""
        return {
            "problem_trees": len(self._problem_trees),
            "global_seqs": self._global.num_seqs() if self._global is not None else 0,
            "support_table_bytes": self._support.nbytes,
        }

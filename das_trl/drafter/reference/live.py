"""Live (in-flight) sources: each request's local tree and its running siblings' outputs.

* Local tree (as arctic's per-request prompt tree, extended with the request's own
  output): models copy from their prompt and repeat themselves within one rollout.
* Sibling trees (DAS: "a group's siblings share a prompt"): one tree per problem over the
  live outputs of its requests, so a long-tail request can draft from siblings that are
  ahead of it or already finished. A finished sibling's output stays visible until the
  next ``add_rollouts`` for its problem brings it into the history (then it is removed,
  so nothing is counted twice) or until the live token budget pushes it out (below).
* Batch tree (``share_running_batch``): one tree over the live outputs of *all* requests in
  the engine, across problems (what vLLM's ``suffix`` method gets from arctic's
  ``add_active_response``): rollouts of different problems in one RL batch share format and
  phrasing, and in the first epoch nothing else is there to draft from. Same lingering
  rules as the sibling trees.

Live token budget (``DrafterConfig.live_token_budget``), the exact eviction rule (a native
implementation must mirror it):

* A request *holds* ``T = len(prompt tail) + output tokens`` live tokens, where the prompt
  tail is the last ``prompt_tail_tokens`` prompt tokens its sibling/batch sequences start
  with. ``T`` is counted once per request, however many live trees (siblings, batch) hold
  its sequence; a request in no live tree (both switched off) holds 0.
* Running requests are never evicted; their tokens are reported (``live_running_tokens``)
  but not bounded here (the engine's own KV cache bounds them).
* ``stop``: a request with no output is dropped at once. Otherwise it becomes a *finished
  output* holding ``T`` tokens, appended to a queue in stop order; then, **when the
  finished outputs hold more than ``live_token_budget`` tokens, the oldest finished outputs
  are dropped until they hold at most half of it** (from every live tree that holds them; the
  one just stopped included).
* ``release_finished(problem)`` (an ``add_rollouts`` of that problem) drops that problem's
  finished outputs whatever their age; they leave the queue and its token count.

So after every public call the finished outputs hold at most ``live_token_budget`` tokens.
Memory: each token a live tree holds costs about ``LIVE_TREE_BYTES_PER_TOKEN`` bytes
(arctic tree nodes plus the n-gram support dicts; measured, docs/reliability.md); a
finished output of ``T`` tokens sits in up to two live trees.

Support counts here live only in this process, so they are dicts keyed by token tuples
(fast, exact); history counts use the numpy table of ``support.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..config import LIVE_TREE_BYTES_PER_TOKEN, DrafterConfig
from .arbitration import Candidate
from .arctic import suffix_tree

if TYPE_CHECKING:
    from .arctic import SuffixTree


@dataclass
class _SiblingGroup:
    tree: SuffixTree
    counts: dict[tuple, int] = field(default_factory=dict)  # gram -> distinct sequences
    grams: dict[int, set[tuple]] = field(default_factory=dict)  # seq id -> its distinct grams
    running: int = 0
    finished: set[int] = field(default_factory=set)
    problem_of: dict[int, int] = field(default_factory=dict)  # seq id -> its request's problem key
    next_seq: int = 0


@dataclass
class _Membership:
    group_key: int  # problem key (siblings) or BATCH_GROUP
    source: str  # arbitration source name
    seq: int  # the request's sequence id in the group's tree
    tail: list[int] = field(default_factory=list)  # last g-1 tokens of that sequence


@dataclass
class _Request:
    problem_key: int
    local: SuffixTree | None
    local_counts: dict[tuple, int]  # gram -> occurrences in prompt + output
    tail: list[int]  # last g-1 tokens of prompt + output
    groups: list[_Membership]
    output_len: int = 0
    prompt_len: int = 0  # tokens in the local tree before any output
    live_tail_len: int = 0  # prompt-tail tokens each of its sibling/batch sequences starts with
    context: list[int] = field(default_factory=list)  # last match_context_tokens of prompt + output
    text_prompt_len: int = 0  # prompt tokens of the request (local tree or not)


@dataclass
class _Finished:
    """A stopped request's output, still visible in the sibling/batch trees."""

    problem_key: int
    members: list[tuple[int, int]]  # (group key, seq id) per live tree holding it
    tokens: int  # live tokens it holds: prompt tail + output (once, however many trees hold it)


# Group key of the cross-problem batch tree (problem keys are >= 0, so it cannot clash).
BATCH_GROUP = -1


class LivePool:
    """Per-request local trees and per-problem sibling trees.

    Args:
        config: the drafter config (``use_local_tree``, ``share_running_siblings``,
            ``live_token_budget``, ``prompt_tail_tokens``, ``support_ngram``, ...).

    Finished outputs are bounded by ``config.live_token_budget`` tokens (module docstring:
    the exact rule). Not thread-safe (the owner locks).
    """

    def __init__(self, config: DrafterConfig, tree_factory=None) -> None:
        self.cfg = config
        self._tree = tree_factory if tree_factory is not None else suffix_tree()
        self._reqs: dict[str, _Request] = {}
        self._groups: dict[int, _SiblingGroup] = {}
        self._init_counters()

    def _init_counters(self) -> None:
        # Finished outputs in stop order (serial -> record), and the serials of each problem's ones.
        self._finished: OrderedDict[int, _Finished] = OrderedDict()
        self._finished_of: dict[int, set[int]] = {}
        self._next_finished = 0
        self._finished_tokens = 0
        self._running_tokens = 0  # live tokens (prompt tail + output) of running requests in sibling/batch trees
        self._tree_tokens = 0  # tokens held by every live tree: local, sibling and batch
        self._evicted_outputs = 0
        self._evicted_tokens = 0

    @property
    def request_ids(self) -> set[str]:
        """Ids of active requests (a new set)."""
        return set(self._reqs)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._reqs

    def problem_of(self, request_id: str) -> int:
        """Problem key of an active request. Raises ``KeyError`` if not active."""
        return self._reqs[request_id].problem_key

    def lengths(self, request_id: str) -> tuple[int, int]:
        """``(prompt tokens, output tokens)`` of an active request. ``KeyError`` if unknown."""
        req = self._reqs[request_id]
        return req.text_prompt_len, req.output_len

    def context_tail(self, request_id: str) -> list[int]:
        """Last ``match_context_tokens`` tokens of a request's prompt + output (a new list). ``KeyError`` if unknown."""
        return list(self._reqs[request_id].context)

    # ------------------------------------------------------------------ lifecycle
    def start(self, request_id: str, prompt: np.ndarray, problem_key: int) -> None:
        """Register a request (prompt: 1-D int32). Raises ``ValueError`` if active."""
        if request_id in self._reqs:
            raise ValueError(f"request {request_id!r} is already active")
        g = self.cfg.support_ngram
        local, counts = None, {}
        if self.cfg.use_local_tree:
            local = self._tree(self.cfg.max_tree_depth)
            local.extend_ndarray(0, prompt.copy())
            p = prompt.tolist()
            for i in range(len(p) - g + 1):
                gram = tuple(p[i:i + g])
                counts[gram] = counts.get(gram, 0) + 1
        req = _Request(problem_key, local, counts, prompt[-(g - 1):].tolist(), [],
                       context=prompt[-self.cfg.match_context_tokens:].tolist(), text_prompt_len=len(prompt))
        if local is not None:
            req.prompt_len = len(prompt)
            self._tree_tokens += len(prompt)
        tail = prompt[-self.cfg.prompt_tail_tokens:] if self.cfg.prompt_tail_tokens else prompt[:0]
        joins = []
        if self.cfg.share_running_siblings:
            joins.append((problem_key, "siblings"))
        if self.cfg.share_running_batch:
            joins.append((BATCH_GROUP, "batch"))
        for group_key, source in joins:
            grp = self._groups.get(group_key)
            if grp is None:
                grp = self._groups[group_key] = _SiblingGroup(self._tree(self.cfg.max_tree_depth))
            member = _Membership(group_key, source, grp.next_seq)
            grp.next_seq = (grp.next_seq + 1) & 0x7FFFFFFF
            grp.running += 1
            grp.grams[member.seq] = set()
            grp.problem_of[member.seq] = problem_key
            grp.tree.extend_ndarray(member.seq, tail.copy())
            self._count_group(grp, member, tail.tolist())
            req.groups.append(member)
            self._tree_tokens += len(tail)
        if req.groups:
            req.live_tail_len = len(tail)
            self._running_tokens += len(tail)
        self._reqs[request_id] = req

    def _count_group(self, grp: _SiblingGroup, member: _Membership, tokens: list[int]) -> None:
        g = self.cfg.support_ngram
        mine = grp.grams[member.seq]
        window = member.tail
        for t in tokens:
            window.append(t)
            if len(window) > g:
                del window[0]
            if len(window) == g:
                h = tuple(window)
                if h not in mine:
                    mine.add(h)
                    grp.counts[h] = grp.counts.get(h, 0) + 1
        del window[:-(g - 1)]

    def extend(self, request_id: str, tokens: list[int]) -> None:
        """Append sampled/accepted tokens to a request's output. ``KeyError`` if unknown."""
        req = self._reqs[request_id]
        if not tokens:
            return
        g = self.cfg.support_ngram
        req.output_len += len(tokens)
        req.context.extend(tokens)
        del req.context[:-self.cfg.match_context_tokens]
        self._tree_tokens += len(tokens) * ((req.local is not None) + len(req.groups))
        if req.groups:
            self._running_tokens += len(tokens)
        if req.local is not None:
            req.local.extend(0, tokens)
            window = req.tail
            for t in tokens:
                window.append(t)
                if len(window) >= g:
                    h = tuple(window[-g:])
                    req.local_counts[h] = req.local_counts.get(h, 0) + 1
            del window[:-(g - 1)]
        else:
            req.tail = (req.tail + tokens)[-(g - 1):]
        for member in req.groups:
            grp = self._groups[member.group_key]
            grp.tree.extend(member.seq, tokens)
            self._count_group(grp, member, tokens)

    def stop(self, request_id: str) -> None:
        """Forget a request; its sibling/batch outputs linger until pushed or evicted (module
        docstring: after the stop, if finished outputs hold more than ``live_token_budget``
        tokens, the oldest are dropped down to half of it). Raises ``KeyError`` if unknown."""
        req = self._reqs.pop(request_id)
        if req.local is not None:
            self._tree_tokens -= req.prompt_len + req.output_len
        if not req.groups:
            return
        held = req.live_tail_len + req.output_len
        self._running_tokens -= held
        members = []
        for member in req.groups:
            grp = self._groups[member.group_key]
            grp.running -= 1
            grp.finished.add(member.seq)
            members.append((member.group_key, member.seq))
        if req.output_len == 0:
            for group_key, seq in members:
                self._drop_member(group_key, seq, held)
            return
        serial = self._next_finished
        self._next_finished += 1
        self._finished[serial] = _Finished(req.problem_key, members, held)
        self._finished_of.setdefault(req.problem_key, set()).add(serial)
        self._finished_tokens += held
        if self._finished_tokens <= self.cfg.live_token_budget:
            return
        # Over the budget: drop the oldest down to half of it, so that the native core, whose automata cannot forget
        # a sequence and are rebuilt after a drop, rebuilds at most once per half-budget of new finished tokens.
        while self._finished_tokens > self.cfg.live_token_budget // 2:
            oldest = next(iter(self._finished))
            self._evicted_outputs += 1
            self._evicted_tokens += self._finished[oldest].tokens
            self._drop_finished(oldest)

    def _drop_finished(self, serial: int) -> None:
        """Drop one finished output from every live tree holding it and from the queue."""
        record = self._finished.pop(serial)
        serials = self._finished_of[record.problem_key]
        serials.discard(serial)
        if not serials:
            del self._finished_of[record.problem_key]
        self._finished_tokens -= record.tokens
        for group_key, seq in record.members:
            self._drop_member(group_key, seq, record.tokens)

    def _drop_member(self, group_key: int, seq: int, tokens: int) -> None:
        grp = self._groups[group_key]
        grp.finished.discard(seq)
        grp.problem_of.pop(seq, None)
        grp.tree.remove(seq)
        self._tree_tokens -= tokens
        for h in grp.grams.pop(seq):
            c = grp.counts[h] - 1
            if c:
                grp.counts[h] = c
            else:
                del grp.counts[h]
        if grp.running == 0 and not grp.finished:
            del self._groups[group_key]

    def release_finished(self, problem_key: int) -> int:
        """Drop the finished outputs of a problem from its sibling tree and the batch tree (its rollouts just
        entered the history), whatever their age. Returns how many tree sequences were dropped (one per live tree
        holding each output)."""
        dropped = 0
        for serial in sorted(self._finished_of.get(problem_key, ())):
            dropped += len(self._finished[serial].members)
            self._drop_finished(serial)
        return dropped

    def clear(self) -> None:
        """Forget all requests and sibling outputs (counters included)."""
        self._reqs.clear()
        self._groups.clear()
        self._init_counters()

    # ------------------------------------------------------------------ drafting
    def candidates(self, request_id: str, context: list[int], max_tokens: int) -> list[Candidate]:
        """Drafts from the sibling tree, the batch tree and the local tree (in that order).

        Support: siblings / batch = other live or finished sequences of that tree containing the g-gram (the
        request's own sequence excluded); local = earlier occurrences of the g-gram in the request's own prompt +
        output. ``KeyError`` if the request is unknown.
        """
        req = self._reqs[request_id]
        cfg = self.cfg
        g1 = cfg.support_ngram - 1
        out = []
        for member in req.groups:
            grp = self._groups[member.group_key]
            if grp.tree.num_seqs() <= 1:
                continue
            d = grp.tree.speculate(context, max_tokens, cfg.max_spec_factor,
                                   cfg.max_spec_offset, cfg.min_token_prob, False)
            if d.token_ids and d.match_len >= cfg.min_match_len:
                tokens = list(d.token_ids)
                h = tuple(context[-g1:] + tokens[:1])
                support = grp.counts.get(h, 0) - (h in grp.grams[member.seq])
                out.append(Candidate(member.source, tokens, list(d.probs), int(d.match_len), support))
        if req.local is not None:
            d = req.local.speculate(context, max_tokens, cfg.max_spec_factor,
                                    cfg.max_spec_offset, cfg.min_token_prob, False)
            if d.token_ids and d.match_len >= cfg.min_match_len:
                tokens = list(d.token_ids)
                support = req.local_counts.get(tuple(context[-g1:] + tokens[:1]), 0)
                out.append(Candidate("local", tokens, list(d.probs), int(d.match_len), support))
        return out

    def stats(self) -> dict:
        """Live pool sizes (ints; tokens are token ids, bytes approximate):

        * ``active_requests``: running requests; ``sibling_groups``: problems with a sibling tree;
        * ``lingering_finished``: finished outputs still visible (requests, not tree sequences);
        * ``live_running_tokens`` / ``live_finished_tokens``: live tokens (prompt tail + output) held in the
          sibling/batch trees by running requests / by finished outputs (the latter <= ``live_token_budget``);
        * ``live_token_budget``: the bound on ``live_finished_tokens``;
        * ``live_evicted_outputs`` / ``live_evicted_tokens``: finished outputs (and their tokens) dropped by the
          budget since the last clear, not counting those released by ``add_rollouts``;
        * ``live_tree_tokens``: tokens held by every live tree (local trees: prompt + output of running requests;
          sibling and batch trees: prompt tail + output per sequence);
        * ``live_approx_bytes``: ``LIVE_TREE_BYTES_PER_TOKEN * live_tree_tokens``.
        """
        return {
            "active_requests": len(self._reqs),
            "sibling_groups": sum(1 for k in self._groups if k != BATCH_GROUP),
            "lingering_finished": len(self._finished),
            "live_running_tokens": self._running_tokens,
            "live_finished_tokens": self._finished_tokens,
            "live_token_budget": self.cfg.live_token_budget,
            "live_evicted_outputs": self._evicted_outputs,
            "live_evicted_tokens": self._evicted_tokens,
            "live_tree_tokens": self._tree_tokens,
            "live_approx_bytes": LIVE_TREE_BYTES_PER_TOKEN * self._tree_tokens,
        }

"""The ``suffix`` baseline: vLLM 0.32's ``suffix`` method as shipped (arctic-inference ``SuffixDecodingCache``).

arctic-inference is optional (the ``reference`` extra): without it, building this drafter raises ``ImportError``
naming the extra (:mod:`das_trl.drafter.reference.arctic`).
"""

from __future__ import annotations

import numpy as np

from .base import Drafter

# vLLM 0.32 defaults (vllm/config/speculative.py): suffix_decoding_max_tree_depth=24, max_cached_requests=10000,
# max_spec_factor=1.0, min_token_prob=0.1; num_speculative_tokens defaults to max_tree_depth.
SUFFIX_DEFAULTS = dict(max_tree_depth=24, max_cached_requests=10000, max_spec_factor=1.0, min_token_prob=0.1,
                       num_speculative_tokens=24)


class SuffixDrafter(Drafter):
    """vLLM's ``suffix`` method as shipped (arctic-inference SuffixDecodingCache, vLLM 0.32 defaults); earlier
    epochs' responses are fed in as cached requests."""

    def __init__(self, **overrides) -> None:
        """Raises ``ImportError`` naming the ``reference`` extra when arctic-inference is missing."""
        from das_trl.drafter.reference.arctic import suffix_decoding_cache

        SuffixDecodingCache = suffix_decoding_cache()  # noqa: N806 - a class
        self.name = "suffix"
        self.p = dict(SUFFIX_DEFAULTS, **overrides)
        self.context_tail = self.p["max_tree_depth"]
        self.cache = SuffixDecodingCache(max_tree_depth=self.p["max_tree_depth"],
                                         max_cached_requests=self.p["max_cached_requests"])

    def prepare(self, train_epochs):
        for e, recs in enumerate(train_epochs):
            for i, r in enumerate(recs):
                rid = f"hist-{e}-{i}"
                self.cache.start_request(rid, np.asarray(r.prompt_ids, dtype=np.int32))
                if r.completion_ids:
                    self.cache.add_active_response(rid, r.completion_ids)
                self.cache.stop_request(rid)

    def end_step(self, records):
        pass  # served responses entered the global cache when their requests stopped (as in vLLM)

    # The calls vLLM's suffix proposer makes per engine step (start on first sight, the tokens each request got,
    # stop when it leaves, one speculate per row: the default draft_step) are timed.
    def start(self, rid, rec):
        prompt = np.asarray(rec.prompt_ids, dtype=np.int32)
        with self.watch:
            self.cache.start_request(rid, prompt)

    def extend(self, rid, tokens):
        with self.watch:
            self.cache.add_active_response(rid, tokens)

    def stop(self, rid):
        with self.watch:
            self.cache.stop_request(rid)

    def budgets(self, running):
        return [self.p["num_speculative_tokens"]] * len(running)

    def propose(self, rid, context, budget):
        pattern = context[-self.p["max_tree_depth"]:]
        draft = self.cache.speculate(rid, pattern, max_spec_tokens=budget, max_spec_factor=self.p["max_spec_factor"],
                                     min_token_prob=self.p["min_token_prob"])
        return list(draft.token_ids)

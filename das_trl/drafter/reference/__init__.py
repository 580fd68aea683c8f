"""The pure-Python reference drafter: the executable specification the native core is tested against.

Imported only by ``create_drafter`` for ``backend="python"`` (or ``"auto"`` where the native core is not built), by
the equivalence tests and by the benchmarks; the default path never imports it. Its suffix trees are
arctic-inference's C++ ``SuffixTree`` (an optional dependency, the ``reference`` extra, loaded in ``arctic.py`` on
first use), or :class:`~das_trl.drafter.reference.reference_tree.ReferenceSuffixTree` (pure Python, no arctic) when
passed as ``tree_factory``.

Data flow::

    DASDrafter.add_rollouts(prompts, completions)            (drafter.py)
        -> RolloutHistory   (..history: window of appearances per problem, token budget, oldest-first eviction)
        -> HistoryIndex     (suffix_index.py: per-problem tree + global tree;
                             support.py: how many sequences contain each n-gram)
    per request: start_request -> [extend_request -> record_acceptance -> propose]* -> stop_request
        -> LivePool         (live.py: local tree of prompt + own output; sibling and batch trees)
        -> arbitration.py   (evidence-weighted choice among the sources; not arctic's raw score)
        -> calibration.py   (the estimates corrected by the acceptance observed in verification)
"""

from .drafter import DASDrafter

__all__ = ["DASDrafter"]

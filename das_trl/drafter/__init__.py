"""DAS drafter core: suffix-tree drafting from a GRPO run's own rollouts (arXiv 2511.13841).

Imports only the standard library, numpy and arctic-inference's C++ ``SuffixTree``; no
vLLM or TRL (the adapter in ``das_trl.vllm`` wraps :class:`DASDrafter`).

Data flow::

    trainer step -> DASDrafter.add_rollouts(prompts, completions)
        -> RolloutHistory   (history.py: last `window` appearances per problem,
                             token budget, oldest-first eviction)
        -> HistoryIndex     (suffix_index.py: per-problem tree + global tree,
                             support.py: how many sequences contain each n-gram)
    engine, per request: start_request -> [extend_request -> record_acceptance -> propose]* -> stop_request
        -> LivePool         (live.py: local tree of prompt + own output; sibling tree
                             of the problem's running/finished outputs)
        -> arbitration.py   (evidence-weighted choice among problem / siblings /
                             local / batch / global candidates; not arctic's raw score)
        -> calibration.py   (the estimates corrected by the acceptance observed in
                             verification, per source, match length and estimate)

Two implementations with one interface: ``NativeDASDrafter`` (``native/``: C++ core, one call per engine step) and
``DASDrafter`` (pure Python, the reference the native core is tested against); :func:`create_drafter` picks one by
``DrafterConfig.backend``.

Problem identity: :func:`problem_key` (blake2b of the prompt ids), or an explicit key.
"""

from .arbitration import SOURCE_ORDER, Candidate, choose, confidence
from .calibration import AcceptanceCalibrator
from .config import DrafterConfig
from .drafter import DASDrafter
from .factory import create_drafter
from .history import Appearance, RolloutHistory
from .problem_key import problem_key

__all__ = [
    "SOURCE_ORDER",
    "AcceptanceCalibrator",
    "Appearance",
    "Candidate",
    "DASDrafter",
    "DrafterConfig",
    "create_drafter",
    "RolloutHistory",
    "choose",
    "confidence",
    "problem_key",
]

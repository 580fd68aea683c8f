"""DAS drafter: suffix-automaton drafting from a GRPO run's own rollouts (arXiv 2511.13841).

The face of the drafter room: what the vLLM adapter, the trainer and the benchmarks use. Imports only the standard
library and numpy (the compiled core loads on first use); no vLLM, TRL or arctic-inference.

* :class:`DrafterConfig` and :func:`create_drafter`: the drafter a config asks for, by default
  :class:`NativeDASDrafter` (``drafter.py`` over the C++ core in ``native/``: one call per engine step).
* :class:`DraftBatch`: one engine step's drafts as arrays.
* :class:`RolloutHistory` / :class:`Appearance`: the per-problem window of pushed rollouts.
* :func:`problem_key`: a problem's identity (blake2b of its prompt ids).
* :class:`RolloutRecord`, :func:`append_records`, :func:`read_records`: the rollout log the replay benchmark reads.

The pure-Python reference drafter, :class:`DASDrafter` (``reference/``, the executable specification the native core
is tested against; needs arctic-inference, the ``reference`` extra), is loaded only when asked for:
``backend="python"``, or ``from das_trl.drafter import DASDrafter``.
"""

from .config import DrafterConfig
from .draft_batch import DraftBatch
from .drafter import NativeDASDrafter
from .factory import create_drafter
from .history import Appearance, RolloutHistory
from .problem_key import problem_key
from .rollout_log import RolloutRecord, append_records, read_records

__all__ = [
    "Appearance",
    "DASDrafter",
    "DraftBatch",
    "DrafterConfig",
    "NativeDASDrafter",
    "RolloutHistory",
    "RolloutRecord",
    "append_records",
    "create_drafter",
    "problem_key",
    "read_records",
]


def __getattr__(name: str):
    if name == "DASDrafter":  # the reference, imported on demand only
        from .reference import DASDrafter

        return DASDrafter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

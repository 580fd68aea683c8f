"""Draft budgets: how many of each request's draft tokens are worth verifying, once per engine step.

The room holds one budget path, the batch budget controller (the product's default): its settings (``config.py``),
the controller itself (``controller.py``: plan before drafting, cut after) and the pure functions it decides with, one
concept a file: sampled remaining lengths and speeds (``remaining.py``), who finishes last and which draft positions
outlive the request (``tail.py``), which rows may draft and how long (``gate.py``), the cost-optimal draft length
(``draft_lengths.py``) and the caps on a step's total (``step_cap.py``). Beside them: the step cost model it prices
with (``cost_model.py``), the per-problem length table it estimates remaining lengths from (``length_table.py``), and
the DAS paper's length tiers (``tiers.py``), kept as the replay baseline that reproduces the paper. Arrays in,
``int32`` budgets out; numpy, the standard library and (optionally) the drafter's native kernel.
Design notes: ``docs/budget.md``, ``docs/concepts.md`` and ``docs/tuning.md``.
"""

from .config import ControllerConfig
from .controller import BudgetController
from .cost_model import CostModel, OnlineCostFit

#: Why ``das_length_policy`` / ``length_policy`` (the earlier tier policy beside the controller) is refused.
LENGTH_POLICY_REMOVED = (
    "das_length_policy (length_policy), the earlier tier policy, is no longer supported (it was removed while das-trl "
    "0.1.0 was developed): the batch budget controller is the only budget path "
    "of the trainer and the engine; set das_budget_controller (a dict of das_trl.budget.ControllerConfig fields, e.g. "
    "{\"c_base_ms\": 7.0, \"c_tok_ms\": 0.025}) instead. The paper's length tiers remain as the replay baseline "
    "`das+policy` (`das-trl bench replay --drafters das+policy`)")

__all__ = ["BudgetController", "ControllerConfig", "CostModel", "LENGTH_POLICY_REMOVED", "OnlineCostFit"]

"""UB fusion: pattern groups first, then cost-based grouping of what is left.

``pattern_fusion.py`` is part (a). Part (b), the cost-based grouping, is XLA priority fusion in shape:
``graph.py`` (a block's nodes and edges), ``model.py`` (cost, capacity and structure of a candidate group,
over ``cost.py``, ``chain.py``, ``attention_chain.py`` and the shared ``tiling`` module), ``queue.py`` (the object that
owns a run: groups, candidates, evaluation, merges, priorities), ``emit.py`` (groups back into Relax) and
``cost_based_fusion.py`` (the pass).
"""

from .pattern_fusion import PatternFusionPass
from .cost import GroupCost, GroupingConfig
from .cost_based_fusion import CostBasedFusionPass

__all__ = ["PatternFusionPass", "CostBasedFusionPass", "GroupCost", "GroupingConfig"]

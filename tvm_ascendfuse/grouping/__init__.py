"""UB fusion: pattern groups first, then cost-based grouping of what is left."""

from .pattern_fusion import PatternFusionPass
from .cost import GroupCost, GroupingConfig
from .grouping import SWITCH as COST_BASED_FUSION
from .grouping import CostBasedFusionPass

__all__ = ["PatternFusionPass", "CostBasedFusionPass", "COST_BASED_FUSION", "GroupCost", "GroupingConfig"]

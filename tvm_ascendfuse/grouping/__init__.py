"""UB fusion: pattern groups first, then grouping of what is left."""

from .pattern_fusion import PatternFusionPass

__all__ = ["PatternFusionPass"]

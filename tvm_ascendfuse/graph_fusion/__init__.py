"""Graph fusion: math-equivalent rewrites on high-level Relax ops, one switchable pass a file.

``GRAPH_FUSION_PASSES`` lists them in the order the pipeline runs them.
"""

GRAPH_FUSION_PASSES: list = []

__all__ = ["GRAPH_FUSION_PASSES"]

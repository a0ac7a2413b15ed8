"""UB-fusion pattern families. Adding a family is adding a module to ``FAMILIES``."""

import importlib

from .registry import PREFIX, PatternSpec, declare, evaluate, pattern_table, register_all

FAMILIES = ()


def load_families() -> None:
    for fam in FAMILIES:
        importlib.import_module(f"{__name__}.{fam}")


__all__ = ["PREFIX", "PatternSpec", "declare", "evaluate", "pattern_table", "register_all", "load_families"]

"""UB-fusion pattern families. Adding a family is adding a module to ``FAMILIES``."""

import importlib

from .registry import PREFIX, PatternSpec, declare, evaluate, pattern_table, register_all

# Family modules, each declaring its ``ascendfuse.<family>.<variant>`` patterns and its CANN switch(es).
FAMILIES = ("conv", "matmul", "norm", "softmax", "attention", "swiglu", "elementwise", "squeeze_excite")


def load_families() -> None:
    for fam in FAMILIES:
        importlib.import_module(f"{__name__}.{fam}")


# Import the families now so their switches are known as soon as the package is (switch files are validated
# against the known names).
load_families()

__all__ = ["PREFIX", "PatternSpec", "declare", "evaluate", "pattern_table", "register_all", "load_families"]

"""CANN-compatible fusion switches: which graph-fusion passes and UB-fusion patterns run.

Accepted forms (both as in CANN's ``--fusion_switch_file``):

* JSON: ``{"Switch": {"GraphFusion": {"ALL": "on", "ConvBatchnormFusionPass": "off"}, "UBFusion": {...}}}``
* flat: one ``PassName:on|off`` per line (``ALL:off`` applies to both kinds; ``#`` starts a comment).

A named pass overrides ``ALL`` of its kind. From TVM, ``PassContext(disabled_pass=[...])`` switches a pass
off and ``required_pass=[...]`` switches it on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SwitchError

GRAPH_FUSION = "GraphFusion"
UB_FUSION = "UBFusion"
CATEGORIES = (GRAPH_FUSION, UB_FUSION)


@dataclass(frozen=True)
class SwitchInfo:
    name: str
    category: str
    description: str
    default_on: bool = True


_REGISTRY: dict[str, SwitchInfo] = {}


def register_switch(name: str, category: str, description: str, default_on: bool = True) -> str:
    """Declare a switchable pass or pattern family; returns the name for use as a constant."""
    if category not in CATEGORIES:
        raise ValueError(f"switch category must be one of {CATEGORIES}, got {category!r}")
    _REGISTRY[name] = SwitchInfo(name, category, description, default_on)
    return name


def known_switches() -> dict[str, SwitchInfo]:
    from . import graph_fusion, patterns, grouping  # noqa: F401  (importing registers their switches)

    return dict(_REGISTRY)


def _parse_value(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "1"):
        return True
    if text in ("off", "false", "0"):
        return False
    raise SwitchError(f"switch '{name}' has value {value!r}; use \"on\" or \"off\"")


@dataclass
class FusionSwitches:
    """Resolved on/off state. ``overrides`` name passes; ``all_of`` holds a category-wide ``ALL``."""

    overrides: dict[str, bool] = field(default_factory=dict)
    all_of: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self):
        known = known_switches()
        unknown = sorted(n for n in self.overrides if n not in known)
        if unknown:
            raise SwitchError(
                f"unknown fusion pass name(s) {', '.join(unknown)}; valid names: {', '.join(sorted(known))}")

    def is_on(self, name: str) -> bool:
        info = known_switches().get(name)
        if info is None:
            raise SwitchError(f"unknown fusion pass name '{name}'")
        if name in self.overrides:
            return self.overrides[name]
        return self.all_of.get(info.category, info.default_on)

    def state(self) -> dict[str, bool]:
        return {name: self.is_on(name) for name in sorted(known_switches())}

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, data: dict) -> "FusionSwitches":
        """The JSON form (with or without the outer ``Switch`` key)."""
        if not isinstance(data, dict):
            raise SwitchError("fusion switch JSON must be an object")
        if "Switch" in data:
            extra = sorted(set(data) - {"Switch"})
            if extra:
                raise SwitchError(f"fusion switch JSON has unknown top-level key(s) {', '.join(extra)}")
            data = data["Switch"]
            if not isinstance(data, dict):
                raise SwitchError("\"Switch\" must be an object with GraphFusion / UBFusion sections")
        overrides, all_of = {}, {}
        for section, entries in data.items():
            if section not in CATEGORIES:
                raise SwitchError(f"unknown fusion switch section '{section}'; use {' or '.join(CATEGORIES)}")
            if not isinstance(entries, dict):
                raise SwitchError(f"section '{section}' must be an object of \"PassName\": \"on|off\"")
            for name, value in entries.items():
                if name.upper() == "ALL":
                    all_of[section] = _parse_value(f"{section}.ALL", value)
                else:
                    info = known_switches().get(name)
                    if info is not None and info.category != section:
                        raise SwitchError(f"'{name}' is a {info.category} pass, not {section}")
                    overrides[name] = _parse_value(name, value)
        return cls(overrides, all_of)

    @classmethod
    def from_flat(cls, text: str) -> "FusionSwitches":
        overrides, all_of = {}, {}
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if ":" not in line:
                raise SwitchError(f"fusion switch line {lineno} '{raw.strip()}' is not of the form PassName:on|off")
            name, value = (s.strip() for s in line.split(":", 1))
            if name.upper() == "ALL":
                flag = _parse_value("ALL", value)
                all_of = {c: flag for c in CATEGORIES}
            else:
                overrides[name] = _parse_value(name, value)
        return cls(overrides, all_of)

    @classmethod
    def from_text(cls, text: str) -> "FusionSwitches":
        stripped = text.lstrip()
        if stripped.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise SwitchError(f"fusion switch file is not valid JSON: {err}") from None
            return cls.from_mapping(data)
        return cls.from_flat(text)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "FusionSwitches":
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise SwitchError(f"cannot read fusion switch file '{path}': {err.strerror}") from None
        try:
            return cls.from_text(text)
        except SwitchError as err:
            raise SwitchError(f"{path}: {err}") from None

    def with_pass_context(self, ctx=None) -> "FusionSwitches":
        """Apply ``PassContext(disabled_pass=..., required_pass=...)`` on top (names we know only)."""
        import tvm

        ctx = ctx or tvm.transform.PassContext.current()
        known = known_switches()
        overrides = dict(self.overrides)
        for name in ctx.required_pass:
            if str(name) in known:
                overrides[str(name)] = True
        for name in ctx.disabled_pass:
            if str(name) in known:
                overrides[str(name)] = False
        return FusionSwitches(overrides, dict(self.all_of))


def resolve_switches(spec=None) -> FusionSwitches:
    """Accept None, a FusionSwitches, a dict (JSON form or ``{name: bool}``) or a file path."""
    if spec is None:
        return FusionSwitches()
    if isinstance(spec, FusionSwitches):
        return spec
    if isinstance(spec, dict):
        if "Switch" in spec or any(k in CATEGORIES for k in spec):
            return FusionSwitches.from_mapping(spec)
        return FusionSwitches({k: _parse_value(k, v) for k, v in spec.items()})
    return FusionSwitches.from_file(spec)

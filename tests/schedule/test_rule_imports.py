"""Rules are peers (dlight's shape): a rule module imports the shared base, analysis and building-block
modules, never another rule module; no schedule module imports the grouping pass (what both need lives in
``tvm_ascendfuse/tiling.py``)."""

import ast
from pathlib import Path

import tvm_ascendfuse.schedule as schedule_pkg

PACKAGE = Path(schedule_pkg.__file__).parent


def _modules():
    return {p.stem: ast.parse(p.read_text()) for p in PACKAGE.glob("*.py")}


def _defines_rule(tree) -> bool:
    return any(isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "ScheduleRule" for b in node.bases)
               for node in tree.body)


def _imports(tree) -> set[str]:
    """Dotted names of everything a module imports, relative ones resolved against the schedule package."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = "tvm_ascendfuse.schedule" + (f".{node.module}" if node.module else "")
            elif node.level == 2:
                base = "tvm_ascendfuse" + (f".{node.module}" if node.module else "")
            else:
                base = node.module or ""
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}      # ``from . import matmul``
    return out


def test_rule_modules_are_found():
    rules = {name for name, tree in _modules().items() if _defines_rule(tree)}
    assert {"attention", "attention_projection", "chained_gemm", "conv", "elementwise", "fallback", "matmul",
            "multi_gemm", "pool", "reduction", "tuned"} <= rules


def test_no_rule_imports_another_rule():
    modules = _modules()
    rules = {name for name, tree in modules.items() if _defines_rule(tree)}
    found = {name: sorted(r for r in rules - {name} if f"tvm_ascendfuse.schedule.{r}" in _imports(modules[name]))
             for name in rules}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_schedules_do_not_import_grouping():
    found = {name: sorted(i for i in _imports(tree) if i.startswith("tvm_ascendfuse.grouping"))
             for name, tree in _modules().items()}
    assert not any(found.values()), {k: v for k, v in found.items() if v}

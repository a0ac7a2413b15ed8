"""``ascendfuse``: compile an ONNX model with the fusion pipeline and write library + report.

    ascendfuse compile MODEL.onnx [--target ascend910b|FILE] [--fusion-switch FILE] [-o OUTDIR] [--portable]
                                   [--no-traffic-baseline] [--no-shape-folding]
    ascendfuse patterns            list switchable passes and pattern names
    ascendfuse report FILE         print the summary of a fusion_result.json
    ascendfuse workload NAME -o F  write one of the built-in example models as ONNX
    ascendfuse tune MODEL.onnx [--target T] --trials N [--kernels NAME,...] -o DIR
                                   tune the kernels' tile choices (MetaSchedule); DIR/<target>/ holds the records

Errors a user can fix print as one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .errors import AscendFuseError

EXIT_USER_ERROR = 2


def _fmt_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def summary_text(report: dict) -> str:
    """The table printed after compiling: ops before, kernels after, per-pass counts."""
    out = []
    s = report.get("summary", {})
    if s:
        out.append(f"model: {s.get('model', '?')}   target: {report.get('target')}")
        out.append(f"ops before: {s.get('ops_before')}   kernels after: {s.get('kernels_after')} "
                   f"(launches: {s.get('launches')})   compile: {s.get('compile_seconds', 0):.1f} s")
    rows = []
    for cat in ("graph_fusion", "ub_fusion", "other"):
        for name, rec in report.get(cat, {}).items():
            reasons = {}
            for e in rec.get("not_effective", []):
                reasons[e["reason"]] = reasons.get(e["reason"], 0) + 1
            why = ", ".join(f"{k}×{v}" for k, v in sorted(reasons.items()))
            rows.append([cat, name, rec["match_times"], rec["effect_times"], why])
    if rows:
        out.append(_fmt_table(rows, ["kind", "pass", "match", "effect", "not effective (reason×n)"]))
    kern = [[k["name"], k.get("launches", 1), "+".join(k.get("ops", [])), k.get("pattern") or "",
             k.get("rule", "")] for k in report.get("kernels", [])]
    if kern:
        out.append(_fmt_table(kern, ["kernel", "n", "source ops", "pattern", "schedule"]))
    traffic = report.get("traffic")
    if isinstance(traffic, dict) and traffic:
        out.append("traffic (GM bytes counted on TIR; NPU time is modeled, not measured):")
        out.append(json.dumps(traffic, indent=2, default=str))
    return "\n\n".join(out)


def cmd_compile(args) -> int:
    from . import compile_model
    from .analysis import relax_op_count
    from .frontend import import_onnx
    from .target import get_target

    model_path = Path(args.model)
    target = get_target(args.target)
    switches = None
    if args.fusion_switch:
        from .switches import FusionSwitches

        switches = FusionSwitches.from_file(args.fusion_switch)
    outdir = Path(args.output)
    _check_writable(outdir)
    mod = import_onnx(model_path, fold_shapes=not args.no_shape_folding)
    ops_before = relax_op_count(mod)
    t0 = time.perf_counter()
    result = compile_model(mod, target=target, switches=switches, portable=args.portable,
                           traffic_baseline=not args.no_traffic_baseline)
    seconds = time.perf_counter() - t0
    report = result.report
    report.sections["summary"] = {
        "model": model_path.name, "ops_before": ops_before, "kernels_after": len(report.kernels),
        "launches": sum(k["launches"] for k in report.kernels), "compile_seconds": round(seconds, 2),
        "host_target": str(result.host_target),
    }
    stem = model_path.stem
    # Write everything into a scratch dir first, so a failure leaves nothing half-written in OUTDIR.
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=outdir, prefix=".ascendfuse-") as tmp:
        tmp = Path(tmp)
        result.executable.export_library(str(tmp / f"{stem}.so"))
        (tmp / f"{stem}.fused.py").write_text(result.scheduled_module.script(show_meta=False))
        report.write(tmp / "fusion_result.json")
        for f in tmp.iterdir():
            os.replace(f, outdir / f.name)
    print(summary_text(report.to_dict()))
    print(f"\nwrote {outdir / (stem + '.so')}, {outdir / (stem + '.fused.py')}, {outdir / 'fusion_result.json'}")
    return 0


def _check_writable(outdir: Path) -> None:
    probe = outdir
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise AscendFuseError(f"output directory '{outdir}' is not writable")


def cmd_patterns(_args) -> int:
    from .patterns import pattern_table
    from .switches import known_switches

    switches = known_switches()
    by_switch: dict[str, list[str]] = {}
    for spec in pattern_table():
        by_switch.setdefault(spec.switch, []).append(spec.name)
    rows = []
    for name, info in sorted(switches.items(), key=lambda kv: (kv[1].category, kv[0])):
        pats = by_switch.get(name, [])
        rows.append([info.category, name, "on" if info.default_on else "off", info.description])
        rows += [["", "", "", f"  pattern {p}"] for p in pats]
    print(_fmt_table(rows, ["kind", "switch name", "default", "what it fuses"]))
    return 0


def cmd_report(args) -> int:
    try:
        data = json.loads(Path(args.file).read_text())
    except (OSError, ValueError) as err:
        raise AscendFuseError(f"cannot read fusion report '{args.file}': {err}") from None
    print(summary_text(data))
    return 0


def cmd_workload(args) -> int:
    try:
        from .workloads import WORKLOADS
    except ImportError:
        raise AscendFuseError("no built-in workloads in this installation") from None
    if args.name not in WORKLOADS:
        raise AscendFuseError(f"unknown workload '{args.name}'; choose from {', '.join(WORKLOADS)}")
    import onnx

    builder = WORKLOADS[args.name][0]
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(builder(), str(out))
    print(f"wrote {out}")
    return 0


def cmd_tune(args) -> int:
    from .tune import check_trials, tune_model

    check_trials(args.trials)
    model = Path(args.model)
    _check_writable(Path(args.output))
    names = [n.strip() for n in args.kernels.split(",") if n.strip()] if args.kernels else None
    summary = tune_model(model, target=args.target, trials=args.trials, output=args.output, kernels=names,
                         portable=args.portable, log=print)
    print(summary.table())
    print(f"\nwrote {summary.database}; compile with ASCENDFUSE_SCHEDULES={args.output} to use it")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ascendfuse", description=__doc__.split("\n")[0])
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile an ONNX model and write library, fused IR and fusion_result.json")
    c.add_argument("model", help="ONNX model file")
    c.add_argument("--target", default="ascend910b", help="preset (ascend910b, ascend310p) or .json/.toml file")
    c.add_argument("--fusion-switch", help="CANN fusion switch file (JSON or PassName:on|off lines)")
    c.add_argument("-o", "--output", default="ascendfuse_out", help="output directory")
    c.add_argument("--portable", action="store_true", help="generic x86-64 code instead of this CPU's features")
    c.add_argument("--no-traffic-baseline", action="store_true",
                   help="skip the TVM-default rows of the traffic table (faster compile of large models)")
    c.add_argument("--no-shape-folding", action="store_true",
                   help="import the ONNX graph as TVM does, without folding shape computations on static "
                        "tensors first (see tvm_ascendfuse/onnx_shapes.py)")
    c.set_defaults(func=cmd_compile)
    sub.add_parser("patterns", help="list passes, patterns and their switch names").set_defaults(func=cmd_patterns)
    r = sub.add_parser("report", help="print the summary of a fusion_result.json")
    r.add_argument("file")
    r.set_defaults(func=cmd_report)
    w = sub.add_parser("workload", help="write a built-in example model as ONNX")
    w.add_argument("name")
    w.add_argument("-o", "--output", required=True)
    w.set_defaults(func=cmd_workload)
    t = sub.add_parser("tune", help="search the kernels' tile choices with MetaSchedule, write a schedule database")
    t.add_argument("model", help="ONNX model file")
    t.add_argument("--target", default="ascend910b", help="preset (ascend910b, ascend310p) or .json/.toml file")
    t.add_argument("--trials", type=int, required=True, help="measured candidates per kernel")
    t.add_argument("--kernels", help="comma-separated kernel names (default: every tunable kernel)")
    t.add_argument("-o", "--output", default="schedules", help="database folder (records go to OUTPUT/<target>/)")
    t.add_argument("--portable", action="store_true", help="tune generic x86-64 code (as compile --portable)")
    t.set_defaults(func=cmd_tune)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except AscendFuseError as err:
        if args.debug:
            raise
        print(f"ascendfuse: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

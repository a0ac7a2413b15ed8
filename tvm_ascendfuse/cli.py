"""``ascendfuse``: compile an ONNX model or a PyTorch exported program with the fusion pipeline and write
library + report.

    ascendfuse compile MODEL.onnx|MODEL.pt2 [--target ascend910b|FILE] [--fusion-switch FILE] [-o OUTDIR]
                                   [--portable] [--no-traffic-baseline] [--verify] [--html] [--quiet]
                                   [--no-shape-folding]
    ascendfuse patterns            list switchable passes and pattern names
    ascendfuse report FILE [--html [-o PAGE]]   print the summary of a fusion_result.json (or write its page)
    ascendfuse workload NAME -o F  write one of the built-in example models as ONNX
    ascendfuse tune MODEL.onnx [--target T] [--trials N] [--budget 30m] [--kernels NAME,...] [-o DIR]
                                   [--fusion-switch FILE] [--rpc-tracker HOST:PORT --rpc-key KEY]
                                   [--work-dir W] [--portable] [--quiet]
                                   tune every tunable kernel's tiles (MetaSchedule); DIR/<target>/<cpu>/ holds
                                   the records; a rerun resumes from the work dir
    ascendfuse rpc tracker [--host 127.0.0.1] [--port 9190]
    ascendfuse rpc server --tracker HOST:PORT --key KEY [--host 127.0.0.1] [--port 9090]
                                   TVM's RPC tracker / server (measure candidates on other hosts or boards)

Errors a user can fix print as one line and exit with code 2; ``--verify`` finding a mismatch exits with 1.
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
from .precision.modes import MODES, short_dtypes

EXIT_USER_ERROR = 2
EXIT_MISMATCH = 1
TORCH_SUFFIXES = (".pt2", ".ep")


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
    kernels = report.get("kernels", [])
    kern = [[k["name"], k.get("launches", 1), "+".join(k.get("ops", [])), k.get("pattern") or "",
             k.get("rule", "")] for k in kernels]
    header = ["kernel", "n", "source ops", "pattern", "schedule"]
    if any(k.get("precision") for k in kernels):
        kern = [row + [precision_cell(k)] for row, k in zip(kern, kernels)]
        header.append("GM dtypes (in -> out)")
    if kern:
        out.append(_fmt_table(kern, header))
    for name in report.get("symbolic_sizes") or ():
        depending = [k["name"] for k in report.get("kernels", []) if name in k.get("symbolic", ())]
        out.append(f"symbolic size '{name}': one build for every value; {len(depending)} kernel(s) depend on it")
    recovered = report.get("ub_overflow_recovered") or []
    if recovered:
        out.append("kernels whose schedule exceeded on-chip capacity (recovered):")
        out.append(_fmt_table([[r.get("kernel"), r.get("scope"), r.get("needed_bytes"), r.get("available_bytes"),
                                r.get("action"), r.get("final_rule") or ""] for r in recovered],
                              ["kernel", "scope", "needed B", "available B", "done", "rule"]))
    races = report.get("write_races_refused") or []
    if races:
        out.append("rule schedules refused: a block writing an output runs some point twice (a race):")
        out.append(_fmt_table([[r.get("kernel"), r.get("rule"), r.get("block"), r.get("points_run_twice"),
                                r.get("final_rule") or "unscheduled"] for r in races],
                              ["kernel", "rule", "block", "points twice", "taken instead"]))
    build = report.get("build") or {}
    if build.get("slowest_kernels"):
        out.append(f"TIR/LLVM build: {build.get('tir_build_seconds')} s on {build.get('jobs')} thread(s); "
                   "slowest kernels:")
        out.append(_fmt_table([[k["name"], f"{k['seconds']:.2f}", k.get("rule") or ""]
                               for k in build["slowest_kernels"][:5]], ["kernel", "seconds", "schedule"]))
    traffic = traffic_text(report)
    if traffic:
        out.append(traffic)
    if report.get("verify"):
        from .verify import verify_text

        out.append(verify_text(report["verify"]))
    return "\n\n".join(out)


def precision_cell(kernel: dict) -> str:
    """A kernel's GM dtypes (it computes in float32 on the host), e.g. ``f16,f32 -> f16``."""
    p = kernel.get("precision")
    if not p:
        return "f32"
    return f"{','.join(short_dtypes(p['inputs']))} -> {short_dtypes([p['output']])[0]}"


def traffic_text(report: dict) -> str:
    """The traffic table: launches, GM MB counted on the TIR, modeled NPU µs, for TVM's default fusion,
    ours and the compulsory lower bound (the rows the report has)."""
    from .report_html import traffic_rows

    rows = [[label, t.get("launches", "-"), f"{t['gm_bytes'] / 1e6:.2f}" if "gm_bytes" in t else "-",
             f"{t['modeled_time_us']:.1f}" if "modeled_time_us" in t else "-"] for label, t in traffic_rows(report)]
    if not rows:
        return ""
    t = report.get("traffic", {})
    notes = []
    if t.get("gm_bytes_vs_lower_bound"):
        notes.append(f"GM vs lower bound {t['gm_bytes_vs_lower_bound']:.2f}x")
    if t.get("modeled_speedup_vs_tvm_default"):
        notes.append(f"modeled speed-up vs TVM default {t['modeled_speedup_vs_tvm_default']:.2f}x")
    table = _fmt_table(rows, ["traffic", "launches", "GM MB (counted)", "NPU us (modeled)"])
    return table + ("\n" + "; ".join(notes) if notes else "")


def import_model(path: Path, fold_shapes: bool = True):
    """(Relax module, reference for --verify or None, reference name): ONNX, or a torch.export file.
    ``fold_shapes``: fold ONNX shape computations on static tensors before import (``frontend.import_onnx``)."""
    if path.suffix.lower() in TORCH_SUFFIXES:
        from .torch_frontend import import_exported_program, load_exported_program
        from .verify import torch_reference

        program = load_exported_program(path)
        return import_exported_program(program), lambda: torch_reference(program), "pytorch (eager)"
    from .frontend import import_onnx, load_onnx
    from .verify import onnxruntime_reference

    proto = load_onnx(path)
    return import_onnx(proto, fold_shapes=fold_shapes), lambda: onnxruntime_reference(proto), "onnxruntime"


def cmd_compile(args) -> int:
    from . import compile_model
    from .analysis import relax_op_count
    from .progress import quiet
    from .target import get_target

    if args.quiet:
        quiet(True)
    model_path = Path(args.model)
    target = get_target(args.target)
    switches = None
    if args.fusion_switch:
        from .switches import FusionSwitches

        switches = FusionSwitches.from_file(args.fusion_switch)
    outdir = Path(args.output)
    _check_writable(outdir)
    mod, make_reference, reference_name = import_model(model_path, fold_shapes=not args.no_shape_folding)
    ops_before = relax_op_count(mod)
    t0 = time.perf_counter()
    result = compile_model(mod, target=target, switches=switches, portable=args.portable,
                           traffic_baseline=not args.no_traffic_baseline, precision_mode=args.precision_mode)
    seconds = time.perf_counter() - t0
    report = result.report
    report.sections["summary"] = {
        "model": model_path.name, "ops_before": ops_before, "kernels_after": len(report.kernels),
        "launches": sum(k["launches"] for k in report.kernels), "compile_seconds": round(seconds, 2),
        "host_target": str(result.host_target),
    }
    stem = model_path.stem
    written = [f"{stem}.so", f"{stem}.fused.py", "fusion_result.json"]
    verified = None
    # Write everything into a scratch dir first, so a failure leaves nothing half-written in OUTDIR.
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=outdir, prefix=".ascendfuse-") as tmp:
        tmp = Path(tmp)
        # The library is written before --verify runs it: TVM 0.27's VM records an empty memory scope for
        # every constant it loads into an executable, and a library exported afterwards carries them, each
        # printed as a "Scope Loaded" warning whenever the library is loaded.
        result.executable.export_library(str(tmp / f"{stem}.so"))
        if args.verify:
            from .verify import verify_compiled

            reference = make_reference()
            verified = verify_compiled(result, mod, reference, reference_name if reference is not None else None)
        (tmp / f"{stem}.fused.py").write_text(result.scheduled_module.script(show_meta=False))
        report.write(tmp / "fusion_result.json")
        if args.html:
            from .report_html import write_html

            write_html(report.to_dict(), tmp / "fusion_report.html")
            written.append("fusion_report.html")
        for f in tmp.iterdir():
            os.replace(f, outdir / f.name)
    print(summary_text(report.to_dict()))
    print("\nwrote " + ", ".join(str(outdir / w) for w in written))
    return EXIT_MISMATCH if verified is not None and not verified.ok else 0


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
    if not isinstance(data, dict) or "kernels" not in data:
        raise AscendFuseError(f"'{args.file}' is not a fusion_result.json (no 'kernels')")
    if args.html:
        from .report_html import write_html

        page = Path(args.output) if args.output else Path(args.file).with_name("fusion_report.html")
        _check_writable(page.parent)
        write_html(data, page)
        print(f"wrote {page}")
        return 0
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
    from .progress import quiet
    from .tune import RPCSpec, check_trials, parse_address, parse_duration, tune_model
    from .tune.rpc import check_key

    if args.quiet:
        quiet(True)
    if args.trials is not None:
        check_trials(args.trials)
    if args.trials is None and args.budget is None:
        raise AscendFuseError("give --trials N (candidates per kernel), --budget DURATION, or both")
    budget = parse_duration(args.budget) if args.budget is not None else None
    rpc = None
    if args.rpc_tracker or args.rpc_key:
        if not (args.rpc_tracker and args.rpc_key):
            raise AscendFuseError("--rpc-tracker HOST:PORT and --rpc-key KEY go together")
        host, port = parse_address(args.rpc_tracker)
        rpc = RPCSpec(host, port, check_key(args.rpc_key))
    switches = None
    if args.fusion_switch:
        from .switches import FusionSwitches

        switches = FusionSwitches.from_file(args.fusion_switch)
    model = Path(args.model)
    _check_writable(Path(args.output))
    names = [n.strip() for n in args.kernels.split(",") if n.strip()] if args.kernels else None
    summary = tune_model(model, target=args.target, trials=args.trials, output=args.output, kernels=names,
                         switches=switches, portable=args.portable, budget=budget, rpc=rpc,
                         work_dir=args.work_dir, quiet=args.quiet)
    print(summary.table())
    print(f"\nwrote {summary.database}; compile with ASCENDFUSE_SCHEDULES={args.output} to use it")
    return 0


def cmd_rpc(args) -> int:
    from .tune import parse_address
    from .tune.rpc import serve, start_server, start_tracker

    if args.role == "tracker":
        tracker = start_tracker(args.host, args.port, silent=not args.verbose)
        return serve(tracker, f"RPC tracker listening on {args.host}:{tracker.port}")
    tracker_addr = parse_address(args.tracker, "--tracker")
    server = start_server(tracker_addr, args.key, args.host, args.port, silent=not args.verbose)
    return serve(server, f"RPC server listening on {args.host}:{server.port}, key {args.key}, tracker "
                         f"{tracker_addr[0]}:{tracker_addr[1]}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ascendfuse", description=__doc__.split("\n")[0])
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a model and write library, fused IR and fusion_result.json")
    c.add_argument("model", help="ONNX model file, or a PyTorch program saved with torch.export.save (.pt2)")
    c.add_argument("--target", default="ascend910b", help="preset (ascend910b, ascend310p) or .json/.toml file")
    c.add_argument("--fusion-switch", help="CANN fusion switch file (JSON or PassName:on|off lines)")
    c.add_argument("-o", "--output", default="ascendfuse_out", help="output directory")
    c.add_argument("--portable", action="store_true", help="generic x86-64 code instead of this CPU's features")
    c.add_argument("--no-traffic-baseline", action="store_true",
                   help="skip the TVM-default rows of the traffic table (faster compile of large models)")
    c.add_argument("--verify", action="store_true",
                   help="run the build and an unfused reference (ONNX Runtime / PyTorch / TVM default) on seeded "
                        "random inputs; on a mismatch name the first kernel that differs (exit code 1)")
    c.add_argument("--html", action="store_true", help="also write fusion_report.html (graphs, kernels, refusals)")
    c.add_argument("--precision-mode", default=None, choices=list(MODES),
                   help="CANN's precision modes: the dtype tensors are stored in between kernels (kernels compute "
                        "in float32); default must_keep_origin_dtype")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    c.add_argument("--no-shape-folding", action="store_true",
                   help="import the ONNX graph as TVM does, without folding shape computations on static "
                        "tensors first (see tvm_ascendfuse/onnx_shapes.py)")
    c.set_defaults(func=cmd_compile)
    sub.add_parser("patterns", help="list passes, patterns and their switch names").set_defaults(func=cmd_patterns)
    r = sub.add_parser("report", help="print the summary of a fusion_result.json")
    r.add_argument("file")
    r.add_argument("--html", action="store_true", help="write the HTML page instead of printing the summary")
    r.add_argument("-o", "--output", help="the page's path (default: fusion_report.html beside FILE)")
    r.set_defaults(func=cmd_report)
    w = sub.add_parser("workload", help="write a built-in example model as ONNX")
    w.add_argument("name")
    w.add_argument("-o", "--output", required=True)
    w.set_defaults(func=cmd_workload)
    t = sub.add_parser("tune", help="search the kernels' tile choices with MetaSchedule, write a schedule database")
    t.add_argument("model", help="ONNX model file")
    t.add_argument("--target", default="ascend910b", help="preset (ascend910b, ascend310p) or .json/.toml file")
    t.add_argument("--trials", type=int, help="measured candidates per kernel (default with --budget: each "
                   "candidate of a kernel's space once)")
    t.add_argument("--budget", help="wall time for the whole run, e.g. 30m, 2h, 1h30m; spent on the kernels in "
                   "proportion to their share of the model's run time")
    t.add_argument("--kernels", help="comma-separated kernel names (default: every tunable kernel)")
    t.add_argument("--fusion-switch", help="CANN fusion switch file, as for compile (the kernels depend on it)")
    t.add_argument("-o", "--output", default="schedules",
                   help="database folder (records go to OUTPUT/<target>/<cpu>/)")
    t.add_argument("--work-dir", help="resumable state (default OUTPUT/<target>/<cpu>/work)")
    t.add_argument("--portable", action="store_true", help="tune generic x86-64 code (as compile --portable)")
    t.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on the servers of this RPC tracker")
    t.add_argument("--rpc-key", metavar="KEY", help="the key the RPC servers registered under")
    t.add_argument("-q", "--quiet", action="store_true", help="no progress bar or progress messages")
    t.set_defaults(func=cmd_tune)
    rpc = sub.add_parser("rpc", help="run TVM's RPC tracker or a server (bound to 127.0.0.1 by default)")
    roles = rpc.add_subparsers(dest="role", required=True)
    rt = roles.add_parser("tracker", help="an RPC tracker: servers register with it, tune asks it for them")
    rt.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    rt.add_argument("--port", type=int, default=9190, help="first port to try (default 9190)")
    rs = roles.add_parser("server", help="an RPC server that measures candidates; registers with a tracker")
    rs.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the tracker to register with")
    rs.add_argument("--key", required=True, help="the key tune's --rpc-key names (one per kind of board)")
    rs.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    rs.add_argument("--port", type=int, default=9090, help="first port to try (default 9090)")
    for role in (rt, rs):
        role.add_argument("--verbose", action="store_true", help="TVM's connection log")
    rpc.set_defaults(func=cmd_rpc)
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

"""Tutorial 4: write and register your own UB-fusion pattern with a check, then switch passes with a CANN
fusion switch file.

What happens:
  1. we build a small Relax model by hand: two branches, each a MatMul followed by softsign
     (x / (1 + |x|)), an activation none of the built-in patterns knows;
  2. we declare a pattern ``ascendfuse.user.matmul_softsign`` as data (``PatternSpec``), with its own
     switch name and a check that reads the target: the output width must be a multiple of the cube unit
     (16 on ascend910b), else the pattern refuses with a reason;
  3. we compile: the 64-wide branch fuses through our pattern, the 40-wide one is refused and the reason
     lands in the report (the cost-based grouping still fuses that branch its own way);
  4. ``verify=True`` checks the build against TVM's default pipeline on random inputs;
  5. a CANN switch file turns our pattern and a built-in graph pass off; the report says
     ``switched_off`` for each match it would have taken.

Run:  .venv/bin/python tutorials/04_custom_pattern.py [--rows 32] [--out DIR]
"""

import argparse
import json
from pathlib import Path

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

import tvm_ascendfuse as af
from tvm_ascendfuse.patterns.checks import dims, float_dtypes
from tvm_ascendfuse.patterns.registry import PatternSpec, declare
from tvm_ascendfuse.switches import UB_FUSION, FusionSwitches, register_switch

# 1. Our pattern's switch: a name CANN-style switch files (and PassContext(disabled_pass=...)) can use.
SWITCH = register_switch("UserMatmulSoftsignFusionPass", UB_FUSION, "MatMul followed by softsign")


def softsign_pattern():
    """matmul(x, w) -> m / (1 + abs(m)); the annotations name the pieces the checks read."""
    x, w = wildcard(), wildcard()
    mm = is_op("relax.matmul")(x, w)
    denom = is_op("relax.add")(is_op("relax.abs")(mm), is_const())
    return is_op("relax.divide")(mm, denom), {"matmul": mm, "lhs": x, "rhs": w}


def cube_aligned_width(ctx, target):
    """A check: None lets the match fuse; a string is the reason it may not (it goes into the report)."""
    shape = dims(ctx.annotated_expr["matmul"])
    if shape is None or not isinstance(shape[-1], int):
        return "output width unknown"
    if shape[-1] % target.cube_n:
        return f"output width {shape[-1]} is not a multiple of the cube unit {target.cube_n}"
    return None


def register_pattern():
    pattern, annotations = softsign_pattern()
    declare(PatternSpec(name="ascendfuse.user.matmul_softsign", switch=SWITCH, pattern=pattern,
                        annotations=annotations, checks=(float_dtypes, cube_aligned_width), priority=100,
                        description="MatMul + softsign in one kernel"))


def build_model(rows: int):
    """[x @ W1 (64 wide) -> softsign] and [z @ W2 (40 wide) -> softsign], both returned. (Two inputs: two
    MatMuls of one input would be merged into one wider MatMul by MatMulSiblingMergeFusionPass first.)"""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, 32), "float32"))
    z = relax.Var("z", relax.TensorType((rows, 32), "float32"))
    with bb.function("main", [x, z]):
        with bb.dataflow():
            outs = []
            for width, x in ((64, x), (40, z)):
                w = relax.const(rng.standard_normal((32, width)).astype("float32") * 0.2)
                m = bb.emit(relax.op.matmul(x, w))
                d = bb.emit(relax.op.add(relax.op.abs(m), relax.const(1.0, "float32")))
                outs.append(bb.emit(relax.op.divide(m, d)))
            gv = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(gv)
    return bb.get()


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--out", default="tutorial_out", help="where the switch file goes")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    register_pattern()
    mod = build_model(args.rows)

    # 3 + 4. compile, with the equivalence check
    result = af.compile_model(mod, target="ascend910b", verify=True)
    rec = result.report.to_dict()["ub_fusion"][SWITCH]
    print(f"{SWITCH}: match_times {rec['match_times']}, effect_times {rec['effect_times']}")
    for refusal in rec["not_effective"]:
        print(f"   not fused: {refusal['reason']} ({refusal.get('check')}): {refusal.get('failed', '')}")
    for k in result.report.kernels:
        print(f"   kernel {k['name'][:48]:48s} pattern {k.get('pattern')}  rule {k.get('rule')}")
    ok = result.verification.ok
    print(f"verify against TVM's default pipeline: {'OK' if ok else 'MISMATCH'}")
    ours_patterns = [k for k in result.report.kernels if k.get("pattern") == "ascendfuse.user.matmul_softsign"]

    # 5. a CANN fusion switch file (the JSON form; "Name:off" lines work too)
    switch_file = out / "fusion_switch.json"
    switch_file.write_text(json.dumps({"Switch": {"GraphFusion": {"ALL": "on", "TransposeChainFusionPass": "off"},
                                                  "UBFusion": {"ALL": "on", SWITCH: "off"}}}, indent=2))
    switches = FusionSwitches.from_file(switch_file)
    off = af.compile_model(mod, target="ascend910b", switches=switches)
    rec_off = off.report.to_dict()["ub_fusion"][SWITCH]
    print(f"\nwith {switch_file}: {SWITCH} match_times {rec_off['match_times']}, effect_times "
          f"{rec_off['effect_times']}, reasons {sorted({e['reason'] for e in rec_off['not_effective']})}")

    good = (rec["match_times"] == 2 and rec["effect_times"] == 1 and len(ours_patterns) == 1 and ok
            and rec_off["effect_times"] == 0
            and {e["reason"] for e in rec_off["not_effective"]} == {"switched_off"})
    print("tutorial checks: " + ("OK" if good else "FAILED"))
    if not good:
        raise SystemExit(1)


if __name__ == "__main__":
    run()

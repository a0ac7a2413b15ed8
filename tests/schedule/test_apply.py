"""The schedule phase: rule dispatch per kernel, attrs kept, report filled, a rule that raises reported as a rule
error (and the next rule tried), a rule's note carried with its schedule."""

import math

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir
from tvm.relax import op

from tvm_ascendfuse.report import FusionReport
from tvm_ascendfuse.schedule.apply import DEFAULT_RULES, ApplyUBSchedules
from tvm_ascendfuse.schedule.base import ScheduleRule, Scheduled
from tvm_ascendfuse.schedule.fast_math import use_fast_math

from .kernels import HOST, NPU, attention_kernel, fused_kernel
from tests.helpers import assert_close


def module_of(**funcs):
    return tvm.IRModule({tvm.ir.GlobalVar(k): v.with_attr("global_symbol", k) for k, v in funcs.items()})


def kernels():
    return dict(
        fused_add_relu=fused_kernel(lambda x, b: op.nn.relu(op.add(x, b)), [(8, 16), (16,)]),
        fused_layer_norm=fused_kernel(lambda x, g, b: op.nn.layer_norm(x, g, b, [-1]), [(4, 32), (32,), (32,)]),
        fused_attention=attention_kernel(h=2, s=16, d=8),
        fused_argmax=fused_kernel(lambda x: op.argmax(x, axis=1), [(4, 9)]),
    )


def test_every_kernel_gets_a_rule_and_keeps_its_attrs():
    report = FusionReport()
    report.set_kernels([{"name": "fused_add_relu", "launches": 1}])
    mod = ApplyUBSchedules(NPU, report, HOST)(module_of(**kernels()))
    rules = report.sections["schedules"]
    assert rules == {"fused_add_relu": "elementwise", "fused_layer_norm": "reduction",
                     "fused_attention": "attention", "fused_argmax": rules["fused_argmax"]}
    assert rules["fused_argmax"] in {"reduction", "fallback"}
    assert report.kernels[0]["rule"] == "elementwise"
    for gv, func in mod.functions.items():
        assert func.attrs["tirx.is_scheduled"]
        assert func.attrs["global_symbol"] == gv.name_hint
        assert func.attrs["tirx.noalias"]


def test_scheduled_functions_are_left_alone():
    k = kernels()["fused_add_relu"].with_attr("tirx.is_scheduled", True)
    report = FusionReport()
    mod = ApplyUBSchedules(NPU, report, HOST)(module_of(done=k))
    assert mod["done"].same_as(module_of(done=k)["done"]) or tvm.ir.structural_equal(mod["done"], k) \
        if hasattr(tvm.ir, "structural_equal") else True
    assert report.sections.get("schedules", {}) == {}


class Exploding(ScheduleRule):
    name = "exploding"

    def apply(self, func, target, host):
        raise RuntimeError("rule bug")


class HalfWay(ScheduleRule):
    """Raises after changing its own schedule: what it did must not reach the kernel."""

    name = "half-way"

    def apply(self, func, target, host):
        sch = s_tir.Schedule(func)
        sch.parallel(sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[-1])[0])
        return [][0]


class Noting(ScheduleRule):
    name = "noting"

    def apply_with_note(self, func, target, host):
        return Scheduled(s_tir.Schedule(func), f"{len(func.params)} params")


def test_a_raising_rule_is_a_reported_error_and_the_next_rule_wins():
    report = FusionReport()
    funcs = {"k": kernels()["fused_add_relu"], "j": kernels()["fused_layer_norm"]}
    mod = ApplyUBSchedules(NPU, report, HOST, rules=[Exploding(), HalfWay(), *DEFAULT_RULES])(module_of(**funcs))
    assert report.sections["schedules"] == {"k": "elementwise", "j": "reduction"}
    errors = [{"rule": "exploding", "message": "RuntimeError: rule bug"},
              {"rule": "half-way", "message": "IndexError: list index out of range"}]
    assert report.sections["rule_errors"] == {"k": errors, "j": errors}
    assert "schedule_notes" not in report.sections                 # errors are not notes
    assert mod["k"].attrs["tirx.is_scheduled"]
    reference = ApplyUBSchedules(NPU, None, HOST)(module_of(**funcs))
    for name in funcs:                                             # the half-way schedule was dropped
        assert tvm_ffi.structural_equal(mod[name], reference[name])


def test_a_declining_rule_is_no_error():
    report = FusionReport()
    ApplyUBSchedules(NPU, report, HOST, rules=DEFAULT_RULES)(module_of(k=kernels()["fused_add_relu"]))
    assert "rule_errors" not in report.sections


def test_notes_travel_with_the_schedule():
    report = FusionReport()
    ApplyUBSchedules(NPU, report, HOST, rules=[Noting()])(module_of(k=kernels()["fused_add_relu"]))
    assert report.sections["schedules"] == {"k": "noting"}
    assert report.sections["schedule_notes"] == {"k": ["3 params"]}
    func = kernels()["fused_add_relu"]
    assert Noting().apply(func, NPU, HOST) is not None             # apply is apply_with_note's schedule

    class Neither(ScheduleRule):
        name = "neither"

    with pytest.raises(NotImplementedError, match="neither apply nor apply_with_note"):
        Neither().apply(func, NPU, HOST)


def test_scheduled_module_matches_unscheduled():
    funcs = kernels()
    mod = ApplyUBSchedules(NPU, None, HOST)(module_of(**funcs))
    rng = np.random.default_rng(0)
    for name, func in funcs.items():
        ref = tvm.compile(module_of(main=func), target="llvm")
        ours = tvm.compile(tvm.IRModule({"main": mod[name].with_attr("global_symbol", "main")}), target=HOST)
        arrays = [rng.standard_normal([int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)) for p in func.params]
        a = [tvm.runtime.tensor(x) for x in arrays]
        b = [tvm.runtime.tensor(x.copy()) for x in arrays]
        ref["main"](*a)
        ours["main"](*b)
        assert_close(b[-1].numpy(), a[-1].numpy(), rtol=1e-4, atol=1e-5)




def test_fast_math_is_exact_enough():
    """Polynomial erf within 1e-5 of erf; exp within 1e-6 relative (incl. the -inf/min-float mask values)."""
    erf_k = fused_kernel(lambda x: op.erf(x), [(2001,)])
    exp_k = fused_kernel(lambda x: op.exp(x), [(2001,)])
    xs_erf = np.linspace(-6, 6, 2001).astype("float32")
    xs_exp = np.concatenate([np.linspace(-100, 88, 1996), [-np.inf, np.finfo("float32").min, 0, 1, -1]]).astype("float32")
    for func, xs, ref, check in [
        (erf_k, xs_erf, np.vectorize(math.erf)(xs_erf.astype("float64")), lambda o, r: np.abs(o - r).max() < 1e-5),
        (exp_k, xs_exp, np.exp(xs_exp.astype("float64")),
         lambda o, r: (np.abs(o - r) <= 1e-6 * np.abs(r) + 1e-37).all()),
    ]:
        fast = use_fast_math(func)
        assert "T.erf(" not in fast.script() and "T.exp(" not in fast.script()
        lib = tvm.compile(tvm.IRModule({"main": fast}), target="llvm")
        out = tvm.runtime.tensor(np.zeros_like(xs))
        lib["main"](tvm.runtime.tensor(xs), out)
        assert check(out.numpy().astype("float64"), ref)


def _build_and_compare(func, scheduled, seed=0):
    rng = np.random.default_rng(seed)
    ref = tvm.compile(module_of(main=func), target="llvm")
    ours = tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), target=HOST)
    arrays = [rng.integers(-5, 5, [int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)) for p in func.params]
    a = [tvm.runtime.tensor(x) for x in arrays]
    b = [tvm.runtime.tensor(x.copy()) for x in arrays]
    ref["main"](*a)
    ours["main"](*b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(y.numpy(), x.numpy())


def test_64bit_buffers_sharing_ub_fall_back():
    """ONNX NLLLoss (``*_ii_expanded``): int64 index arithmetic with a bool mask, two outputs staged in UB.
    TVM packs a scope's buffers at 32-bit offsets and aborts on the int64 one ("bits_offset % elem_bits");
    the elementwise rule's schedule is declined with the reason, the fallback's builds and matches."""
    from tvm import relax

    two_out = fused_kernel(lambda a: relax.Tuple([op.equal(a, a), op.add(a, op.negative(a))]), [(3, 2)], "int64")
    report = FusionReport()
    mod = ApplyUBSchedules(NPU, report, HOST)(module_of(k=two_out))
    assert report.sections["schedules"]["k"] == "fallback"
    assert any("wider than 32 bits" in n for n in report.sections["schedule_notes"]["k"])
    _build_and_compare(two_out, mod["k"])
    # one 64-bit buffer alone in UB (nothing to pack it after) keeps the elementwise rule
    one_out = fused_kernel(lambda a, b: op.add(a, op.multiply(a, b)), [(33, 17), (33, 17)], "int64")
    report = FusionReport()
    mod = ApplyUBSchedules(NPU, report, HOST)(module_of(k=one_out))
    assert report.sections["schedules"]["k"] == "elementwise"
    _build_and_compare(one_out, mod["k"])


def test_epilogue_across_heads_fits_on_the_matmul_rule():
    """A GEMM epilogue that transposes across heads and reshapes (Swin-T's attention output) once overfilled
    UB: unsimplified reshape indices gave each tile a region of several windows (1.3 MiB of UB). With the
    indices simplified before the rules read the kernel (``indices.py``) the matmul rule's tile fits even a
    16 KiB UB; it builds and matches."""
    from tvm_ascendfuse.analysis.ub_usage import kernel_usage
    from tvm_ascendfuse.target import get_target

    tiny = get_target("ascend910b", name="tiny-ub", ub_bytes=16384, ub_reserved_bytes=0)
    b, h, s, d = 8, 3, 49, 32
    func = fused_kernel(lambda a, v: op.reshape(op.permute_dims(op.matmul(a, v), [0, 2, 1, 3]), (b, s, h * d)),
                        [(b, h, s, s), (b, h, s, d)])
    report = FusionReport()
    mod = ApplyUBSchedules(tiny, report, HOST)(module_of(k=func))
    assert report.sections["schedules"]["k"] == "matmul"
    assert not any("schedule needs" in n for n in report.sections.get("schedule_notes", {}).get("k", []))
    assert kernel_usage("k", mod["k"], tiny).bytes("local.UB") <= tiny.capacity("local.UB")
    rng = np.random.default_rng(0)
    ref = tvm.compile(module_of(main=func), target="llvm")
    ours = tvm.compile(tvm.IRModule({"main": mod["k"].with_attr("global_symbol", "main")}), target=HOST)
    arrays = [rng.standard_normal([int(x) for x in p.ty.shape]).astype("float32") for p in func.params]
    a = [tvm.runtime.tensor(x) for x in arrays]
    c = [tvm.runtime.tensor(x.copy()) for x in arrays]
    ref["main"](*a)
    ours["main"](*c)
    assert_close(c[-1].numpy(), a[-1].numpy(), rtol=1e-4, atol=1e-5)

"""TransposeChainFusionPass: chains of permute_dims collapse to one (or none), numbers unchanged."""

import tvm
from tvm import relax

from tests.graph_fusion.common import assert_same_after, assert_switched_off, ops, run_pass
from tvm_ascendfuse.graph_fusion import TransposeChainFusionPass as P


def chain(axes_list, shape=(2, 3, 4, 5), extra_use=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y, mids = x, []
            for axes in axes_list:
                y = bb.emit(relax.op.permute_dims(y, axes))
                mids.append(y)
            out = bb.emit(relax.op.add(y, mids[0])) if extra_use else y
            gv = bb.emit_output(relax.op.nn.relu(out))
        bb.emit_func_output(gv)
    return bb.get()


def test_three_swaps_become_one():
    mod = chain([[0, 2, 1, 3]] * 3)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["permute_dims", "nn.relu"]
    assert [int(a) for a in out["main"].body.blocks[0].bindings[0].value.attrs.axes] == [0, 2, 1, 3]
    assert_same_after(mod, out)


def test_identity_chain_disappears():
    mod = chain([[0, 2, 1, 3], [0, 2, 1, 3]])
    out, _ = run_pass(P, mod)
    assert ops(out) == ["nn.relu"]
    assert_same_after(mod, out)


def test_mixed_axes_compose_in_order():
    mod = chain([[0, 2, 1, 3], [0, 1, 3, 2], [3, 0, 2, 1]])
    out, _ = run_pass(P, mod)
    assert ops(out) == ["permute_dims", "nn.relu"]
    assert_same_after(mod, out)


def test_reverse_axes_none():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.permute_dims(bb.emit(relax.op.permute_dims(x, None)), [1, 0, 2]))
            gv = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(gv)
    mod = bb.get()
    out, _ = run_pass(P, mod)
    assert ops(out) == ["permute_dims", "nn.relu"]
    assert_same_after(mod, out)


def test_intermediate_used_elsewhere_stays():
    mod = chain([[0, 2, 1, 3], [0, 2, 1, 3]], shape=(2, 3, 3, 5), extra_use=True)
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1
    assert ops(out).count("permute_dims") == 1     # the shared first transpose; the second one is gone
    assert_same_after(mod, out)


def test_single_transpose_untouched_and_switch_off():
    mod = chain([[0, 2, 1, 3]])
    out, rec = run_pass(P, mod)
    assert rec.match_times == 0
    tvm.ir.assert_structural_equal(out, mod)
    assert_switched_off(P, chain([[0, 2, 1, 3]] * 2), 1)

"""A conv over a concat (``schedule/concat_staging.py``): the staged input is copied one loop per part, no
element chooses its source; numbers equal to the unscheduled kernel on the NCHW[vl]c staging (a large plane)
and on the root staging with a BN + ReLU prologue (DenseNet's dense layer on 14x14 and 28x28 planes, one block
of rows per core; 7x7 keeps its select chain), on this machine's vectors and on the portable 4-lane host; parts
the channel vectors do not divide keep the one staging block (AVX-512 and AVX2 widths)."""

from __future__ import annotations

import pytest
import tvm
from tvm.relax import op

from tests.schedule.kernels import HOST, NATIVE, NPU, check_rule, fused_kernel
from tvm_ascendfuse.schedule.common import new_schedule, num_cores, root_blocks
from tvm_ascendfuse.schedule.concat_staging import channel_parts
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.conv_schedule import STAGE_MIN_ROWS_PER_CORE
from tvm_ascendfuse.schedule.hostvec import host_vector

# explicit hosts of both vector widths, for structure only (code built for them may not run on this machine)
AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})


def concat_conv(n_parts: int):
    """SqueezeNet's squeeze conv: concat(parts) -> 1x1 conv + bias + ReLU."""
    def build(*args):
        parts, (w, b) = args[:n_parts], args[n_parts:]
        return op.nn.relu(op.add(op.nn.conv2d(op.concat(list(parts), axis=1), w), b))
    return build


def dense_layer(n_parts: int):
    """DenseNet's dense layer: concat(parts) -> x * s + t -> ReLU -> 1x1 conv + bias + ReLU (the BN's scale
    and shift as parameters: a fused kernel takes its constants as arguments)."""
    def build(*args):
        parts, (w, b, s, t) = args[:n_parts], args[n_parts:]
        x = op.nn.relu(op.add(op.multiply(op.concat(list(parts), axis=1), s), t))
        return op.nn.relu(op.add(op.nn.conv2d(x, w), b))
    return build


def kernel(build, part_channels, hw, oc, per_channel=0):
    """The fused kernel of ``build`` over parts of ``part_channels`` channels on an ``hw`` plane, ``oc``
    output channels, ``per_channel`` more (1, C, 1, 1) operands; the weight marked constant (packed)."""
    c = sum(part_channels)
    shapes = [(1, k, *hw) for k in part_channels] + [(oc, c, 1, 1), (1, oc, 1, 1)] + [(1, c, 1, 1)] * per_channel
    return fused_kernel(build, shapes).with_attr("layout_free_buffers", [len(part_channels)])


def partition_blocks(mod) -> int:
    return sum(1 for line in mod.script().splitlines() if 'sblock("pad_temp' in line and line.rstrip().endswith(
        '_partition"):'))


def test_channel_parts_read_from_the_select_chain():
    func = kernel(concat_conv(3), (16, 32, 16), (6, 6), 16)
    sch = new_schedule(func)
    blocks = list(root_blocks(sch))
    assert channel_parts(sch, blocks[0]) == [16, 48]        # the concat block itself
    # a padding test on rows/columns is not a part boundary: a plain pad block has none
    pad = fused_kernel(lambda x, w: op.nn.conv2d(x, w, padding=[1] * 4), [(1, 8, 6, 6), (8, 8, 3, 3)])
    sch = new_schedule(pad)
    assert channel_parts(sch, list(root_blocks(sch))[0]) is None


@pytest.mark.parametrize("host", [NATIVE, HOST], ids=["native", "portable"])
def test_nchwc_staging_one_loop_per_part(host):
    """A pointwise conv on a 40x40 plane stages its input NCHW[vl]c: two parts, two staging loops."""
    mod = check_rule(Conv2dRule(), kernel(concat_conv(2), (32, 64), (40, 40), 16), host=host)
    assert partition_blocks(mod) == 2, mod.script()
    assert "T.if_then_else" not in _lowered_staging(mod, host)


@pytest.mark.parametrize("hw", [(14, 14), (28, 28), (7, 7)])
@pytest.mark.parametrize("host", [NATIVE, HOST], ids=["native", "portable"])
def test_dense_layer_staging_one_loop_per_part(hw, host):
    """DenseNet: BN + ReLU of a concat of 64 + 3 x 32 channels staged at the root, one loop per part in
    one block of rows per core; a 7x7 plane (fewer than 4 rows a core) keeps the one staging block."""
    parts = (64, 32, 32, 32)
    mod = check_rule(Conv2dRule(), kernel(dense_layer(len(parts)), parts, hw, 128, per_channel=2), host=host)
    split = hw[0] >= STAGE_MIN_ROWS_PER_CORE * num_cores(host)
    assert partition_blocks(mod) == (len(parts) if split else 0), mod.script()
    if split:
        assert "T.if_then_else" not in _lowered_staging(mod, host)


def test_parts_the_vectors_do_not_divide_keep_one_staging_block():
    """Parts of half a vector and one and a half (8 + 24 channels on AVX-512's 16-channel vectors, 4 + 12 on
    AVX2's 8): the NCHW[vl]c staging keeps its select; the unscheduled kernel's numbers at this host's width."""
    def parts_of(host):
        lanes = host_vector(host).lanes("float32")
        return kernel(concat_conv(2), (lanes // 2, 3 * lanes // 2), (40, 40), 16)

    def one_select_staging(mod, host):
        lanes = host_vector(host).lanes("float32")
        staged = [ln for ln in mod.script().splitlines() if "pad_temp = T.sblock_alloc_buffer" in ln]
        return (len(staged) == 1 and staged[0].rstrip().endswith(f"T.int64({lanes})))")    # NCHW[vl]c
                and partition_blocks(mod) == 0 and "T.if_then_else" in _lowered_staging(mod, host))

    for host in (AVX512, AVX2):
        assert one_select_staging(Conv2dRule().apply(parts_of(host), NPU, host).mod, host), host
    assert one_select_staging(check_rule(Conv2dRule(), parts_of(NATIVE), host=NATIVE), NATIVE)


def test_switched_off_keeps_one_staging_block():
    mod = check_rule(Conv2dRule(concat_parts=False), kernel(concat_conv(2), (32, 64), (40, 40), 16), host=NATIVE)
    assert partition_blocks(mod) == 0


def _lowered_staging(mod, host) -> str:
    """The function through the first steps of TVM's TIR lowering up to its simplification (where the
    conditions of each part become constants)."""
    import tvm
    from tvm import s_tir, tirx

    steps = [s_tir.transform.LowerInitBlock(), s_tir.transform.ConvertBlocksToOpaque(),
             s_tir.transform.LowerMatchBuffer(), s_tir.transform.LowerOpaqueBlock(), tirx.transform.StmtSimplify()]
    with tvm.target.Target(host):
        return tvm.ir.transform.Sequential(steps)(mod).script()


@pytest.mark.parametrize("form,bound", [("b<=c", 6), ("b>c", 6), ("c<b", 6), ("c>=b", 6),
                                        ("b<c", 7), ("b>=c", 7), ("c>b", 7), ("c<=b", 7)])
def test_every_comparison_form_gives_the_first_channel_of_a_part(form, bound):
    """A choice written ``b > c`` (or any other order) ends a part at the same channel as ``c < b``: the
    boundary is where the condition changes value (b = 6 here)."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.tirx.script.builder import ir as T

    i64 = T.int64
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            a = T.arg("A", T.buffer((i64(1), i64(12), i64(2), i64(2)), "float32"))
            out = T.arg("B", T.buffer((i64(1), i64(12), i64(2), i64(2)), "float32"))
            with T.grid(i64(1), i64(12), i64(2), i64(2)) as (n, c, y, x):
                with T.sblock("stage"):
                    vn, vc, vy, vx = T.axis.remap("SSSS", [n, c, y, x])
                    b = i64(6)
                    cond = {"b<=c": b <= vc, "b>c": b > vc, "c<b": vc < b, "c>=b": vc >= b,
                            "b<c": b < vc, "b>=c": b >= vc, "c>b": vc > b, "c<=b": vc <= b}[form]
                    T.buffer_store(out, T.if_then_else(cond, a[vn, vc, vy, vx], T.float32(0)), [vn, vc, vy, vx])
    sch = new_schedule(ib.get())
    assert channel_parts(sch, sch.get_sblock("stage")) == [bound]

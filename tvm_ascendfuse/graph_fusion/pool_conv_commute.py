"""PoolConvCommuteFusionPass: an average pool next to a 1x1 conv moves to the side where it costs less.

Rewrites (``conv`` a 1x1 conv2d with stride 1 and no padding, ``pool`` any avg_pool2d, ``+ b`` optional)::

    y = pool(conv(x, W) [+ b])   ->  y = conv(pool(x), W) [+ b]     (DenseNet's transition: 2x2 / 2 pool)
    y = conv(pool(x), W)         ->  y = pool(conv(x, W))           (Inception's pool branch: 3x3 / 1 pool)

Why: both are linear maps of one pixel's channels (the conv) and of one channel's plane (the pool, whose
divisor depends on the output pixel only, never on the channel), so they commute, and the two orders cost
very differently. DenseNet-121's transitions compute a 1x1 conv over 56x56, 28x28 and 14x14 planes and then
average 2x2 blocks: pooled first, the conv runs on a quarter of the pixels (3 x 205 MFLOP -> 3 x 51 MFLOP).
Inception-v3's pool branches average 192..2048 channels over 3x3 windows and then reduce them to 32..192
with a 1x1 conv: convolved first, the pool runs over the conv's few output channels.

The order is chosen by counting (``_cost``): the conv's multiply-adds plus the pool's window taps, a tap
weighted ``POOL_TAP_COST`` multiply-adds (a pool tap is a load and an add with no reuse, a conv's FMA runs
from registers at the vector width); the rewrite is taken only when the other order counts less, else
recorded as refused with both counts.

Exact up to float rounding (the sums are reassociated). A bias moves with the conv across the pool only when
the pool of a constant plane is that constant (no padding and no ceil-mode partial windows, or padding not
counted in the divisor); a bias already behind the conv (``conv(pool(x)) + b``) stays behind it. Nothing
per-element may sit between the two (a ReLU does not commute with the average). The intermediate must have
no other consumer. Float dtypes only (an integer average rounds).
"""

from __future__ import annotations

from tvm import relax

from ..switches import POOL_CONV_COMMUTE as NAME
from ._graph import FunctionGraph, GraphRewritePass, Refusal, Rewrite, int_list, op_name, static_shape

# Multiply-adds one pool window tap counts as: a tap loads an element used by one output (no register reuse)
# where a conv's FMA reuses its operands from registers; its exact value hardly matters for the cases above
# (DenseNet's transitions count 3.3x less swapped, Inception's pool branches 1.3-2.4x less).
POOL_TAP_COST = 4


def _pool_attrs(call) -> dict:
    a = call.attrs
    return dict(pool_size=int_list(a.pool_size), strides=int_list(a.strides), padding=int_list(a.padding),
                dilation=int_list(a.dilation), ceil_mode=bool(a.ceil_mode),
                count_include_pad=bool(a.count_include_pad), layout=str(a.layout),
                out_layout=str(a.out_layout or a.layout))


def _pointwise_conv(call) -> str | None:
    """Why ``call`` is not a conv that commutes with a pool (None when it is): 1x1 window, stride 1, no padding,
    NCHW / OIHW, static shapes, float output."""
    a = call.attrs
    w = static_shape(call.args[1])
    if w is None or len(w) != 4 or tuple(w[2:]) != (1, 1):
        return f"the conv's window is {list(w[2:]) if w else '?'}, not 1x1"
    if int_list(a.strides) != [1, 1] or any(int_list(a.padding)):
        return f"the conv has stride {int_list(a.strides)} and padding {int_list(a.padding)}"
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout)) != ("NCHW", "OIHW", "NCHW"):
        return f"the conv's layouts are {a.data_layout}/{a.kernel_layout}"
    return None


def _plain_pool(call) -> str | None:
    p = _pool_attrs(call)
    if (p["layout"], p["out_layout"]) != ("NCHW", "NCHW"):
        return f"the pool's layout is {p['layout']}"
    return None


def _const_preserving(p: dict) -> bool:
    """The pool of a constant plane is that constant (so a bias may cross it): every window's divisor
    counts exactly the taps it reads."""
    return not p["count_include_pad"] or (not any(p["padding"]) and not p["ceil_mode"])


def _cost(cin: int, cout: int, groups: int, pix_in: int, pix_out: int, taps: int, pool_first: bool) -> int:
    """Multiply-adds (a pool tap as POOL_TAP_COST) of the pair in one order; ``pix_in``/``pix_out`` the pool's
    input and output pixels per image."""
    macs = cin * cout // groups
    if pool_first:
        return taps * pix_out * cin * POOL_TAP_COST + macs * pix_out
    return macs * pix_in + taps * pix_out * cout * POOL_TAP_COST


def _bias(graph: FunctionGraph, var, channels: int):
    """(conv var, bias expr) when ``var = conv + b`` with a constant per-channel ``b``, else None."""
    add = graph.call(var, "relax.add")
    if add is None:
        return None
    for conv, other in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        b = graph.const(other)
        if graph.call(conv, "relax.nn.conv2d") is not None and b is not None \
                and tuple(b.shape) in ((1, channels, 1, 1), (channels, 1, 1)):
            return conv, other
    return None


class PoolConvCommuteFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph: FunctionGraph):
        value = graph.value(var)
        name = op_name(value)
        if name == "relax.nn.avg_pool2d":
            return self._conv_then_pool(var, value, graph)
        if name == "relax.nn.conv2d":
            return self._pool_then_conv(var, value, graph)
        return None

    def _conv_then_pool(self, var, pool, graph):
        """``pool(conv(x) [+ b])`` -> ``conv(pool(x)) [+ b]``."""
        src, bias = pool.args[0], None
        found = _bias(graph, src, static_shape(src)[1]) if static_shape(src) else None
        if found is not None:
            (conv_var, bias), internal = found, {src, found[0]}
        else:
            conv_var, internal = src, {src}
        conv = graph.call(conv_var, "relax.nn.conv2d")
        if conv is None or _pointwise_conv(conv) is not None or _plain_pool(pool) is not None:
            return None
        p = _pool_attrs(pool)
        shapes = self._shapes(conv, var, graph)
        if shapes is None:
            return None
        where = dict(order="conv_then_pool", channels=[shapes[0], shapes[1]], pool=p["pool_size"],
                     stride=p["strides"])
        if not all(graph.single_use(v) for v in internal):
            raise Refusal(internal=internal, failed="the conv's result has other consumers", **where)
        if bias is not None and not _const_preserving(p):
            raise Refusal(internal=internal, failed="a bias cannot cross a pool whose divisor counts padding",
                          **where)
        now, swapped = _cost(*shapes, pool_first=False), _cost(*shapes, pool_first=True)
        if swapped >= now:
            raise Refusal(internal=internal, failed=f"pooling first counts {swapped} multiply-adds, not fewer than "
                                                    f"{now}", **where)
        pooled = relax.op.nn.avg_pool2d(conv.args[0], **p)
        out = relax.Call(conv.op, [pooled, conv.args[1]], conv.attrs)
        if bias is not None:
            out = relax.op.add(out, bias)
        return Rewrite(var, out, internal, dict(where, madds=[now, swapped]))

    def _pool_then_conv(self, var, conv, graph):
        """``conv(pool(x))`` -> ``pool(conv(x))``."""
        pool_var = conv.args[0]
        pool = graph.call(pool_var, "relax.nn.avg_pool2d")
        if pool is None or _pointwise_conv(conv) is not None or _plain_pool(pool) is not None:
            return None
        p = _pool_attrs(pool)
        shapes = self._shapes(conv, pool_var, graph)
        if shapes is None:
            return None
        where = dict(order="pool_then_conv", channels=[shapes[0], shapes[1]], pool=p["pool_size"],
                     stride=p["strides"])
        if not graph.single_use(pool_var):
            raise Refusal(internal={pool_var}, failed="the pool's result has other consumers", **where)
        now, swapped = _cost(*shapes, pool_first=True), _cost(*shapes, pool_first=False)
        if swapped >= now:
            raise Refusal(internal={pool_var}, failed=f"convolving first counts {swapped} multiply-adds, not fewer "
                                                      f"than {now}", **where)
        convolved = relax.Call(conv.op, [pool.args[0], conv.args[1]], conv.attrs)
        return Rewrite(var, relax.op.nn.avg_pool2d(convolved, **p), {pool_var}, dict(where, madds=[now, swapped]))

    @staticmethod
    def _shapes(conv, pool_var, graph: FunctionGraph) -> tuple | None:
        """(C_in, C_out, groups, pool input pixels, pool output pixels, window taps) from static shapes, or
        None (symbolic shapes, a non-float dtype). The conv keeps the plane, so the pool's input plane is the
        conv's input plane in either order."""
        x, w, out = static_shape(conv.args[0]), static_shape(conv.args[1]), static_shape(pool_var)
        if None in (x, w, out) or len(x) != 4 or len(out) != 4:
            return None
        if not str(conv.args[0].ty.dtype).startswith(("float", "bfloat")):
            return None
        taps = 1
        for k in int_list(graph.value(pool_var).attrs.pool_size):
            taps *= k
        return (int(x[1]), int(w[0]), int(conv.attrs.groups), int(x[2] * x[3]), int(out[2] * out[3]), taps)

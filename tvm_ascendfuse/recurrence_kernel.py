"""One kernel for the whole recurrence of one direction of an LSTM, GRU or RNN layer.

Unrolled, a recurrence is one step kernel per time step (plus the lookup of its projection rows): each a
VM call and, on the host, a wake-up of the thread pool, for a step whose work is one pass over the recurrent
weight. Here the step loop is inside the kernel: the weight is read by the same function for every step and
no VM call separates two steps.

Both directions of a bidirectional layer are one kernel: step ``s`` of the forward direction (time
``s``) and of the reverse one (time ``steps - 1 - s``) are independent, so one parallel region per step
covers the panels of both, and with the panels handed to the cores in contiguous runs each core keeps
reading the same direction's weight (a GRU of 256 units: 768 KB, its L2).

What the kernel takes (the converter, ``onnx_recurrent``, lays it out once; for constant weights the
layout is folded at compile time):

* ``proj`` (steps x batch, directions x gates x hidden): the input projection of every step with its bias
  (both directions' products as one GEMM of steps x batch rows, as the GEMM writes it), columns per direction in *panel order* ``[panel, gate, unit]``
  (``units`` hidden units per panel, every gate of those units);
* ``w`` (directions, panels, hidden, gates x units): the recurrent weight ``R^T`` cut into the same panels,
  each one contiguous run of memory;
* the initial state(s) (directions, batch, hidden), and for a GRU with ``linear_before_reset`` the recurrent
  bias of its third gate (directions, hidden).

It writes ``y`` (steps, directions, batch, hidden), ONNX's ``Y`` of layout 0: every step's hidden state in
time order (a reverse direction walks the steps backwards), and for an LSTM the last cell state (directions,
batch, hidden). One panel holds every gate of its units, so the state update of a unit reads only its own
panel: panels are independent within a step, and a step reads the previous step's ``y`` row whole, so the
only ordering is step after step.

Two forms of the same computation: the *reference* form (serial loops, libm's activations) that the
converter emits and TVM's own lowering can build as it is, and the *scheduled* form that the recurrence
rule (``schedule/recurrence.py``) puts in its place: each step's panels spread over the cores (one parallel
region per step, whose end is the barrier between steps), the panel's accumulators in vector registers,
the gates vectorised with the polynomial exp of ``schedule.fast_math``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from .schedule.fast_math import fast_sigmoid_expr

ATTR = "ascendfuse.recurrence"
GATES = {"lstm": 4, "gru": 3, "gru_lbr0": 3, "rnn": 1}
# Columns of one panel at most: eight AVX-512 vectors of accumulators per row (the GEMV rule's panel).
MAX_PANEL_COLUMNS = 128
# Accumulator vectors of one panel at most, over its batch rows (AVX-512 has 32 registers: the rest hold the
# weight loads and the broadcast state).
MAX_ACCUMULATOR_VECTORS = 24
K_UNROLL = 4


@dataclass(frozen=True)
class LayerSpec:
    """One layer (one or both directions): the kernel's shapes and the direction(s) it walks the steps in."""

    kind: str          # lstm, gru (linear_before_reset), gru_lbr0 (without it), rnn
    steps: int
    batch: int
    hidden: int
    units: int         # hidden units per panel
    directions: int    # 2: forward and reverse
    reverse: bool      # one direction, walked backwards

    @property
    def gates(self) -> int:
        return GATES[self.kind]

    @property
    def panels(self) -> int:
        return self.hidden // self.units

    def encode(self) -> str:
        return (f"{self.kind},{self.steps},{self.batch},{self.hidden},{self.units},{self.directions},"
                f"{int(self.reverse)}")

    @staticmethod
    def decode(text: str) -> "LayerSpec":
        kind, *nums = str(text).split(",")
        steps, batch, hidden, units, dirs, rev = (int(v) for v in nums)
        return LayerSpec(kind, steps, batch, hidden, units, dirs, bool(rev))


def panel_units(hidden: int, gates: int, batch: int = 1, lanes: int = 16) -> int:
    """Units per panel: a divisor of ``hidden`` whose panel (gates x units columns) fits
    ``MAX_PANEL_COLUMNS`` and whose accumulators (batch rows of it) fit ``MAX_ACCUMULATOR_VECTORS`` vector
    registers, a multiple of the vector lanes where one is (whole vectors for the gates), the largest such."""
    columns = min(MAX_PANEL_COLUMNS, max(lanes, MAX_ACCUMULATOR_VECTORS * lanes // max(1, batch)))
    fits = [d for d in range(1, hidden + 1) if hidden % d == 0 and d * gates <= columns]
    whole = [d for d in fits if d % lanes == 0]
    return max(whole or fits or [1])


def _fast_tanh(x):
    # tanh(x) = 2 sigmoid(2x) - 1: the polynomial exp, vectorisable (libm's tanh is one call per lane)
    return tirx.const(2.0, "float32") * fast_sigmoid_expr(tirx.const(2.0, "float32") * x) - tirx.const(1.0, "float32")


def layer_kernel(spec: LayerSpec, scheduled: bool, cores: int = 1, lanes: int = 16) -> tirx.PrimFunc:
    """The kernel of ``spec`` in its reference form (``scheduled=False``: serial, the panels in the scheduled
    form's order for one core) or its scheduled form (its panels in ``cores`` parallel chunks; the panel's
    accumulators as unrolled vectors of at most ``lanes`` float32: one register each, so they stay in
    registers across the k loop)."""
    make = {"lstm": _lstm, "gru": _gru, "gru_lbr0": _gru_lbr0, "rnn": _rnn}[spec.kind]
    # private: the module names it (a TVMScript function carries its Python name as its global symbol, the
    # same for every direction and shape)
    # (gru_lbr0's second product has units columns only: its vectors divide those)
    width = spec.units if spec.kind == "gru_lbr0" else spec.gates * spec.units
    func = make(spec, scheduled, cores if scheduled else 1, math.gcd(width, lanes) if scheduled else 1)
    func = func.without_attr("global_symbol")
    return func.with_attr(ATTR, spec.encode()).with_attr("tirx.noalias", True)


def _loops(spec: LayerSpec, scheduled: bool, cores: int):
    """(chunk loop, vector loop, unrolled loop, sigmoid, tanh) of one form."""
    if scheduled:
        par = T.parallel if cores > 1 and spec.directions * spec.panels > 1 else T.serial
        return par, T.vectorized, T.unroll, fast_sigmoid_expr, _fast_tanh
    return T.serial, T.serial, T.serial, tirx.sigmoid, tirx.tanh


def _chunks(spec: LayerSpec, cores: int):
    """(chunks, panels per chunk, order): the panels of both directions in ``cores`` contiguous chunks, one
    per core (each core reads the same weight panels every step); ``order(s, chunk, i)`` is the panel a
    chunk computes ``i``-th at step ``s``: forwards on even steps, backwards on odd ones, so a step starts
    on the panels the previous one ended on, still in the core's L2 when its chunk does not fit there
    (lstm2: 2 MB per core, 1 MB of L2)."""
    total = spec.directions * spec.panels
    chunks = cores if cores > 1 and total % cores == 0 else (total if cores > 1 else 1)
    per = total // chunks

    def order(s, chunk, i):
        return chunk * per + i + (s % 2) * (per - 1 - 2 * i)
    return chunks, per, order


def _time(spec: LayerSpec):
    """Functions of (step, direction): the time the step computes, and the time of the step before it
    (clamped into range; step 0 reads the initial state instead). Forward 0..S-1, reverse S-1..0."""
    S = spec.steps

    def rev(d):
        return d if spec.directions == 2 else (1 if spec.reverse else 0)

    def time(s, d):
        return rev(d) * (S - 1) + (1 - 2 * rev(d)) * s

    def before(s, d):
        return T.min(T.max(time(s, d) - (1 - 2 * rev(d)), 0), S - 1)
    return time, before


def _panel_steps(spec: LayerSpec, scheduled: bool, L: int):
    """What every kernel's panel does in a step, as TVMScript macros of the form's loops: ``load_state`` the
    previous hidden state (the initial one at step 0) into ``hl`` (1, batch, hidden); ``start`` the
    accumulators (batch, n) from the step's projection columns ``col:col + n`` of the panel; ``clear`` them;
    ``product`` adds ``h[d] @ w`` over the panel's weight columns ``col:col + n``, with ``k`` unrolled and
    the accumulators as vectors of ``L`` lanes."""
    B, H, P = spec.batch, spec.hidden, spec.panels
    GU = spec.gates * spec.units
    KU = K_UNROLL if H % K_UNROLL == 0 else 1
    _, vec, unr, _, _ = _loops(spec, scheduled, 1)
    time, before = _time(spec)

    @T.macro
    def load_state(hl, h0, y, s, dp):
        for b, k in T.grid(B, H):
            hl[0, b, k] = T.if_then_else(s == 0, h0[dp // P, b, k], y[before(s, dp // P), dp // P, b, k])

    @T.macro
    def start(acc, proj, s, dp, col, n):
        for b in unr(B):
            for jo in unr(n // L):
                for jl in vec(L):
                    acc[b, jo * L + jl] = proj[time(s, dp // P) * B + b, dp * GU + col + jo * L + jl]

    @T.macro
    def clear(acc, n):
        for b in unr(B):
            for jo in unr(n // L):
                for jl in vec(L):
                    acc[b, jo * L + jl] = T.float32(0.0)

    @T.macro
    def product(acc, h, d, w, dp, col, n):
        for ko in T.serial(H // KU):
            for ki in unr(KU):
                for b in unr(B):
                    for jo in unr(n // L):
                        for jl in vec(L):
                            acc[b, jo * L + jl] = acc[b, jo * L + jl] + h[d, b, ko * KU + ki] * w[
                                dp // P, dp % P, ko * KU + ki, col + jo * L + jl]
    return load_state, start, clear, product


def _lstm(spec: LayerSpec, scheduled: bool, cores: int, L: int) -> tirx.PrimFunc:
    S, B, H, U, P, D = spec.steps, spec.batch, spec.hidden, spec.units, spec.panels, spec.directions
    GU, N = 4 * U, 4 * H
    par, vec, unr, sig, tanh = _loops(spec, scheduled, cores)
    C, Q, zigzag = _chunks(spec, cores)
    time, _ = _time(spec)
    load_state, start, _, product = _panel_steps(spec, scheduled, L)

    # The cell state is updated in place in ``c`` (a unit's cell is read and written by its own panel only);
    # its new value is read back for h (a Let inside a vectorised loop would hold one lane, TVM 0.27).
    @T.prim_func(s_tir=True)
    def lstm_layer(proj: T.Buffer((S * B, D * N), "float32"), w: T.Buffer((D, P, H, GU), "float32"),
                   h0: T.Buffer((D, B, H), "float32"), c0: T.Buffer((D, B, H), "float32"),
                   y: T.Buffer((S, D, B, H), "float32"), c: T.Buffer((D, B, H), "float32")):
        with T.sblock("root"):
            # one opaque block under the root: the block analyses of the schedule phase (weight
            # pre-packing) see a kernel of one block and leave it alone
            with T.sblock("recurrence"):
                T.reads(proj[0:S * B, 0:D * N], w[0:D, 0:P, 0:H, 0:GU], h0[0:D, 0:B, 0:H], c0[0:D, 0:B, 0:H],
                        y[0:S, 0:D, 0:B, 0:H], c[0:D, 0:B, 0:H])
                T.writes(y[0:S, 0:D, 0:B, 0:H], c[0:D, 0:B, 0:H])
                for d, b, u in T.grid(D, B, H):
                    c[d, b, u] = c0[d, b, u]
                for s in T.serial(S):
                    for cq in par(C):
                        for qi in T.serial(Q):
                            dp = zigzag(s, cq, qi)
                            hl = T.decl_buffer((1, B, H), "float32", scope="local")
                            acc = T.decl_buffer((B, GU), "float32", scope="local")
                            load_state(hl, h0, y, s, dp)
                            start(acc, proj, s, dp, 0, GU)
                            product(acc, hl, 0, w, dp, 0, GU)
                            for b in unr(B):
                                for uu in vec(U):
                                    c[dp // P, b, dp % P * U + uu] = (
                                        sig(acc[b, 2 * U + uu]) * c[dp // P, b, dp % P * U + uu]
                                        + sig(acc[b, uu]) * tanh(acc[b, 3 * U + uu]))
                                    y[time(s, dp // P), dp // P, b, dp % P * U + uu] = (
                                        sig(acc[b, U + uu]) * tanh(c[dp // P, b, dp % P * U + uu]))
    return lstm_layer


def _gru(spec: LayerSpec, scheduled: bool, cores: int, L: int) -> tirx.PrimFunc:
    """GRU with ``linear_before_reset``: the reset gate multiplies ``h @ Rh^T + Rbh``, so one product per
    step covers all three gates (without it: ``_gru_lbr0``)."""
    S, B, H, U, P, D = spec.steps, spec.batch, spec.hidden, spec.units, spec.panels, spec.directions
    GU, N = 3 * U, 3 * H
    par, vec, unr, sig, tanh = _loops(spec, scheduled, cores)
    C, Q, zigzag = _chunks(spec, cores)
    time, _ = _time(spec)
    load_state, _, clear, product = _panel_steps(spec, scheduled, L)

    @T.prim_func(s_tir=True)
    def gru_layer(proj: T.Buffer((S * B, D * N), "float32"), w: T.Buffer((D, P, H, GU), "float32"),
                  rbh: T.Buffer((D, H), "float32"), h0: T.Buffer((D, B, H), "float32"),
                  y: T.Buffer((S, D, B, H), "float32")):
        with T.sblock("root"):
            with T.sblock("recurrence"):
                T.reads(proj[0:S * B, 0:D * N], w[0:D, 0:P, 0:H, 0:GU], rbh[0:D, 0:H], h0[0:D, 0:B, 0:H],
                        y[0:S, 0:D, 0:B, 0:H])
                T.writes(y[0:S, 0:D, 0:B, 0:H])
                for s in T.serial(S):
                    for cq in par(C):
                        for qi in T.serial(Q):
                            dp = zigzag(s, cq, qi)
                            hl = T.decl_buffer((1, B, H), "float32", scope="local")
                            acc = T.decl_buffer((B, GU), "float32", scope="local")
                            load_state(hl, h0, y, s, dp)
                            clear(acc, GU)
                            product(acc, hl, 0, w, dp, 0, GU)
                            for b in unr(B):
                                for uu in vec(U):
                                    # the candidate n replaces its product in acc; then h' = n + z (h - n)
                                    acc[b, 2 * U + uu] = tanh(
                                        proj[time(s, dp // P) * B + b, dp * GU + 2 * U + uu]
                                        + sig(proj[time(s, dp // P) * B + b, dp * GU + U + uu] + acc[b, U + uu])
                                        * (acc[b, 2 * U + uu] + rbh[dp // P, dp % P * U + uu]))
                                    y[time(s, dp // P), dp // P, b, dp % P * U + uu] = acc[b, 2 * U + uu] + sig(
                                        proj[time(s, dp // P) * B + b, dp * GU + uu] + acc[b, uu]) * (
                                        hl[0, b, dp % P * U + uu] - acc[b, 2 * U + uu])
    return gru_layer


def _gru_lbr0(spec: LayerSpec, scheduled: bool, cores: int, L: int) -> tirx.PrimFunc:
    """GRU without ``linear_before_reset`` (ONNX's default): ``n = tanh(x Wn + (r * h) Rn^T + b)`` needs every
    unit's reset gate before its product, so a step is two passes over the panels, each its own parallel
    region (the end of the first is the barrier the second needs): z and r of every unit (the panel's first
    2 x units columns), stored with ``r * h`` in the kernel's scratch; then ``(r * h) @ Rn^T`` (the panel's
    last units columns), the candidate and the new state. Every bias is in ``proj`` (without
    linear_before_reset Rbn adds to the product, not under r)."""
    S, B, H, U, P, D = spec.steps, spec.batch, spec.hidden, spec.units, spec.panels, spec.directions
    GU, N = 3 * U, 3 * H
    par, vec, unr, sig, tanh = _loops(spec, scheduled, cores)
    C, Q, zigzag = _chunks(spec, cores)
    time, before = _time(spec)
    load_state, start, _, product = _panel_steps(spec, scheduled, L)

    @T.prim_func(s_tir=True)
    def gru_lbr0_layer(proj: T.Buffer((S * B, D * N), "float32"), w: T.Buffer((D, P, H, GU), "float32"),
                       h0: T.Buffer((D, B, H), "float32"), y: T.Buffer((S, D, B, H), "float32")):
        with T.sblock("root"):
            with T.sblock("recurrence"):
                T.reads(proj[0:S * B, 0:D * N], w[0:D, 0:P, 0:H, 0:GU], h0[0:D, 0:B, 0:H], y[0:S, 0:D, 0:B, 0:H])
                T.writes(y[0:S, 0:D, 0:B, 0:H])
                # the update gate and r * h of the step, shared by all panels between the two passes
                z = T.decl_buffer((D, B, H), "float32")
                rh = T.decl_buffer((D, B, H), "float32")
                for s in T.serial(S):
                    for cq in par(C):
                        for qi in T.serial(Q):
                            dp = zigzag(s, cq, qi)
                            hl = T.decl_buffer((1, B, H), "float32", scope="local")
                            acc = T.decl_buffer((B, 2 * U), "float32", scope="local")
                            load_state(hl, h0, y, s, dp)
                            start(acc, proj, s, dp, 0, 2 * U)
                            product(acc, hl, 0, w, dp, 0, 2 * U)
                            for b in unr(B):
                                for uu in vec(U):
                                    z[dp // P, b, dp % P * U + uu] = sig(acc[b, uu])
                                    rh[dp // P, b, dp % P * U + uu] = sig(acc[b, U + uu]) * hl[0, b, dp % P * U + uu]
                    for cq in par(C):
                        for qi in T.serial(Q):
                            dp = zigzag(s + 1, cq, qi)
                            acc = T.decl_buffer((B, U), "float32", scope="local")
                            start(acc, proj, s, dp, 2 * U, U)
                            product(acc, rh, dp // P, w, dp, 2 * U, U)
                            for b in unr(B):
                                for uu in vec(U):
                                    # h' = n + z (h - n), n = tanh(acc) kept in acc
                                    acc[b, uu] = tanh(acc[b, uu])
                                    y[time(s, dp // P), dp // P, b, dp % P * U + uu] = acc[b, uu] + z[
                                        dp // P, b, dp % P * U + uu] * (T.if_then_else(
                                            s == 0, h0[dp // P, b, dp % P * U + uu],
                                            y[before(s, dp // P), dp // P, b, dp % P * U + uu]) - acc[b, uu])
    return gru_lbr0_layer


def _rnn(spec: LayerSpec, scheduled: bool, cores: int, L: int) -> tirx.PrimFunc:
    S, B, H, U, P, D = spec.steps, spec.batch, spec.hidden, spec.units, spec.panels, spec.directions
    par, vec, unr, sig, tanh = _loops(spec, scheduled, cores)
    C, Q, zigzag = _chunks(spec, cores)
    time, _ = _time(spec)
    load_state, start, _, product = _panel_steps(spec, scheduled, L)

    @T.prim_func(s_tir=True)
    def rnn_layer(proj: T.Buffer((S * B, D * H), "float32"), w: T.Buffer((D, P, H, U), "float32"),
                  h0: T.Buffer((D, B, H), "float32"), y: T.Buffer((S, D, B, H), "float32")):
        with T.sblock("root"):
            with T.sblock("recurrence"):
                T.reads(proj[0:S * B, 0:D * H], w[0:D, 0:P, 0:H, 0:U], h0[0:D, 0:B, 0:H], y[0:S, 0:D, 0:B, 0:H])
                T.writes(y[0:S, 0:D, 0:B, 0:H])
                for s in T.serial(S):
                    for cq in par(C):
                        for qi in T.serial(Q):
                            dp = zigzag(s, cq, qi)
                            hl = T.decl_buffer((1, B, H), "float32", scope="local")
                            acc = T.decl_buffer((B, U), "float32", scope="local")
                            load_state(hl, h0, y, s, dp)
                            start(acc, proj, s, dp, 0, U)
                            product(acc, hl, 0, w, dp, 0, U)
                            for b in unr(B):
                                for uu in vec(U):
                                    y[time(s, dp // P), dp // P, b, dp % P * U + uu] = tanh(acc[b, uu])
    return rnn_layer

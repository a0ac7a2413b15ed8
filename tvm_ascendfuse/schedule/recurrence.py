"""A whole recurrent layer (``recurrence_kernel``): the step loop inside one kernel, each step's panels over
the cores.

The converter (``onnx_recurrent``) emits the layer's reference form: serial loops that TVM's lowering
builds as they are. This rule puts the scheduled form of the same computation in its place: per step, one
parallel region over the panels of the recurrent weight in one contiguous chunk per core, walked forwards
and backwards on alternate steps (a core starts a step on the panels still in its L2; the region's end is
the barrier the next step needs), the panel's accumulators in vector registers with ``k`` unrolled, the
gates vectorised with the polynomial exp.
On a one-core host the panel loop stays serial (a parallel region would only add the pool's wake-up).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..recurrence_kernel import ATTR, LayerSpec, layer_kernel
from ..target import AscendTarget
from .base import ScheduleRule, Scheduled
from .hostvec import host_vector
from .common import new_schedule


class RecurrenceRule(ScheduleRule):
    """Kernels the recurrent converters tagged with ``ascendfuse.recurrence``; every other kernel declines."""

    name = "recurrence"

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host):
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None or ATTR not in func.attrs:
            return None
        spec = LayerSpec.decode(func.attrs[ATTR])
        hv = host_vector(host)
        cores = hv.cores
        new = layer_kernel(spec, scheduled=True, cores=cores, lanes=hv.lanes("float32"))
        if _params(new) != _params(func):
            return None        # not the kernel the tag describes (edited after the converter): leave it
        for key, value in func.attrs.items():     # the kernel's own attrs (its symbol, op pattern) carry over
            new = new.with_attr(key, value)
        sch = new_schedule(tvm.IRModule({"main": new}))
        split = f"{spec.panels} panels of {spec.units} units over {cores} core(s)" if cores > 1 else \
            f"{spec.panels} panels of {spec.units} units, one core"
        return Scheduled(sch, f"recurrence: {spec.kind} layer of {spec.steps} steps in one kernel, {split}")


def _params(func: tirx.PrimFunc) -> list:
    return [(str(p.ty.dtype), [int(d) for d in p.ty.shape]) if isinstance(p.ty, tirx.BufferType) else None
            for p in func.params]

"""The NPU description every phase reads: buffer sizes, alignment, bandwidth and peak compute.

Sizes of the two presets are public figures. HBM bandwidth, vector throughput and launch overhead are
modelling assumptions (documented per field in ``FIELD_DOCS``); every figure the cost model derives from
them is a *modeled* estimate, never a measurement.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .errors import TargetError
from .host_threads import physical_cores

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class AscendTarget:
    name: str
    ub_bytes: int
    ub_reserved_bytes: int
    l1_bytes: int
    l0a_bytes: int
    l0b_bytes: int
    l0c_bytes: int
    cube_cores: int
    vector_cores: int
    clock_ghz: float
    cube_m: int = 16
    cube_n: int = 16
    cube_k: int = 16
    ub_align: int = 32
    l1_align: int = 32
    l0ab_align: int = 512
    l0c_align: int = 64
    hbm_gbps: float = 1600.0
    vector_bytes_per_cycle: int = 256
    launch_overhead_us: float = 3.0
    double_buffer: bool = True
    bf16: bool = True             # the cube/vector units compute in bfloat16 (Ascend 910B); 310P: fp16 only
    # Bytes a float32 tensor takes on chip: 2 for a kernel a precision mode stores in 16 bits (set per kernel
    # by the pipeline, ``precision/on_chip.py``: the host computes such a kernel in float32, the NPU holds its
    # UB/L1 tiles in 16 bits); accumulators in L0C stay float32 either way.
    float_bytes: int = 4

    # ---- derived figures -------------------------------------------------------------------------
    @property
    def ub_usable(self) -> int:
        """Bytes of UB a kernel may allocate (the rest is reserved by the runtime)."""
        return self.ub_bytes - self.ub_reserved_bytes

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9

    def cube_flops(self) -> float:
        """Modeled peak of the cube units (fp16 multiply-accumulate = 2 FLOPs)."""
        return 2.0 * self.cube_m * self.cube_n * self.cube_k * self.cube_cores * self.clock_ghz * 1e9

    def vector_flops(self, dtype_bytes: int = 4) -> float:
        """Modeled peak of the vector units: one lane op per element of a vector_bytes_per_cycle register."""
        return self.vector_bytes_per_cycle / dtype_bytes * self.vector_cores * self.clock_ghz * 1e9

    def element_bytes(self, dtype, scope: str = "ub") -> int:
        """Bytes one element of ``dtype`` takes in an on-chip ``scope`` of this NPU: a float32 element takes
        ``float_bytes`` outside L0C (the cube's accumulator, float32 on the NPU whatever the inputs)."""
        from .ir import dtype_bytes     # ir imports tvm: late, so that target files load without it

        nbytes = dtype_bytes(dtype)
        if str(dtype) == "float32" and scope.lower().split(".")[-1] != "l0c":
            return min(nbytes, self.float_bytes)
        return nbytes

    def align_up(self, nbytes: int, scope: str = "ub") -> int:
        """Round a buffer up to the alignment its memory demands."""
        align = {"ub": self.ub_align, "l1": self.l1_align, "l0a": self.l0ab_align,
                 "l0b": self.l0ab_align, "l0c": self.l0c_align}[scope.lower()]
        return -(-int(nbytes) // align) * align

    def capacity(self, scope: str) -> int:
        """Usable bytes of a storage scope (``local.UB``, ``local.L1``, ``local.L0A``, ...)."""
        key = scope.lower().split(".")[-1]
        table = {"ub": self.ub_usable, "l1": self.l1_bytes, "l0a": self.l0a_bytes,
                 "l0b": self.l0b_bytes, "l0c": self.l0c_bytes}
        if key not in table:
            raise TargetError(f"unknown on-chip scope '{scope}'; known: {', '.join(sorted(table))}")
        return table[key]

    # ---- host execution ---------------------------------------------------------------------------
    def host_target(self, portable: bool = False, num_cores: int | None = None):
        """The llvm Target the kernels run on here. UB tiling becomes cache blocking on the CPU.

        By default it uses this machine's CPU: LLVM's name for it, corrected by the vector extensions the CPU
        reports where the two differ (``host_features.py``); ``portable=True`` builds for generic x86-64.
        ``num-cores`` (what the schedules split parallel loops for) is the host's cores, as many as the
        runtime's threads (``host_threads.py``).
        """
        import tvm

        config: dict[str, Any] = {
            "kind": "llvm",
            "keys": ["ascend", "cpu"],
            "model": self.name,
            "num-cores": int(num_cores or physical_cores()),
        }
        if not portable:
            from .host_features import host_mattr

            config["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
            mattr = host_mattr(config["mcpu"])
            if mattr:
                config["mattr"] = mattr
        return tvm.target.Target(config)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELD_DOCS = {
    "ub_bytes": "Unified Buffer size per AI core",
    "ub_reserved_bytes": "UB kept by the runtime; usable = ub_bytes - ub_reserved_bytes",
    "l1_bytes": "L1 buffer feeding the cube unit",
    "l0a_bytes": "cube left operand buffer",
    "l0b_bytes": "cube right operand buffer",
    "l0c_bytes": "cube accumulator buffer",
    "cube_cores": "AI cores with a cube unit",
    "vector_cores": "vector cores (AIV)",
    "clock_ghz": "core clock",
    "cube_m": "cube fractal M (fp16)",
    "cube_n": "cube fractal N (fp16)",
    "cube_k": "cube fractal K (fp16)",
    "ub_align": "UB buffer alignment in bytes",
    "l1_align": "L1 buffer alignment in bytes",
    "l0ab_align": "L0A/L0B alignment in bytes",
    "l0c_align": "L0C alignment in bytes",
    "hbm_gbps": "ASSUMPTION: sustained off-chip bandwidth, GB/s",
    "vector_bytes_per_cycle": "ASSUMPTION: vector unit width per core per cycle",
    "launch_overhead_us": "ASSUMPTION: fixed cost of one kernel launch, microseconds",
    "double_buffer": "tiles are double-buffered (working set counted twice)",
    "bf16": "the compute units take bfloat16 (precision modes force_bf16 / allow_mix_precision_bf16)",
    "float_bytes": "bytes of a float32 element on chip outside L0C (2: a kernel stored in 16 bits; set per kernel "
                   "by the precision plan)",
}

PRESETS: dict[str, AscendTarget] = {
    "ascend910b": AscendTarget(
        name="ascend910b", ub_bytes=192 * KiB, ub_reserved_bytes=8 * KiB, l1_bytes=512 * KiB,
        l0a_bytes=64 * KiB, l0b_bytes=64 * KiB, l0c_bytes=128 * KiB, cube_cores=24, vector_cores=48,
        clock_ghz=1.8, hbm_gbps=1600.0, vector_bytes_per_cycle=256, launch_overhead_us=3.0,
    ),
    "ascend310p": AscendTarget(
        # 8 AI cores, each with its own vector unit; LPDDR4X memory. Reserved UB: same convention as 910B
        # (assumption).
        name="ascend310p", ub_bytes=256 * KiB, ub_reserved_bytes=8 * KiB, l1_bytes=1 * MiB,
        l0a_bytes=64 * KiB, l0b_bytes=64 * KiB, l0c_bytes=256 * KiB, cube_cores=8, vector_cores=8,
        clock_ghz=1.08, hbm_gbps=204.8, vector_bytes_per_cycle=256, launch_overhead_us=3.0, bf16=False,
    ),
}

_FIELD_TYPES = {f.name: f.type for f in fields(AscendTarget)}
_INT_FIELDS = {n for n, t in _FIELD_TYPES.items() if t == "int"}
_FLOAT_FIELDS = {n for n, t in _FIELD_TYPES.items() if t == "float"}


def _coerce(key: str, value: Any) -> Any:
    if key not in _FIELD_TYPES:
        raise TargetError(f"unknown target field '{key}'; valid fields: {', '.join(sorted(_FIELD_TYPES))}")
    if key == "name":
        if not isinstance(value, str) or not value:
            raise TargetError("target field 'name' must be a non-empty string")
        return value
    if key in ("double_buffer", "bf16"):
        if not isinstance(value, bool):
            raise TargetError(f"target field '{key}' must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TargetError(f"target field '{key}' must be a number, got {value!r}")
    if key in _INT_FIELDS:
        if int(value) != value:
            raise TargetError(f"target field '{key}' must be a whole number of bytes/units, got {value!r}")
        value = int(value)
    else:
        value = float(value)
    return value


def validate(t: AscendTarget) -> AscendTarget:
    """Reject descriptions no NPU could have; each message names the field."""
    for key in _INT_FIELDS | _FLOAT_FIELDS:
        v = getattr(t, key)
        if key == "ub_reserved_bytes":
            if v < 0:
                raise TargetError(f"target field 'ub_reserved_bytes' must be >= 0, got {v}")
        elif v <= 0:
            raise TargetError(f"target field '{key}' must be positive, got {v}")
    if t.ub_reserved_bytes >= t.ub_bytes:
        raise TargetError(
            f"target field 'ub_reserved_bytes' ({t.ub_reserved_bytes}) leaves no usable UB of 'ub_bytes' ({t.ub_bytes})")
    if t.ub_bytes > t.l1_bytes:
        raise TargetError(f"target field 'ub_bytes' ({t.ub_bytes}) is larger than 'l1_bytes' ({t.l1_bytes})")
    if t.float_bytes not in (2, 4):
        raise TargetError(f"target field 'float_bytes' must be 2 or 4, got {t.float_bytes}")
    for key in ("ub_align", "l1_align", "l0ab_align", "l0c_align"):
        v = getattr(t, key)
        if v & (v - 1):
            raise TargetError(f"target field '{key}' must be a power of two, got {v}")
    return t


def make_target(base: str | AscendTarget = "ascend910b", **overrides: Any) -> AscendTarget:
    """A preset (or target) with some fields replaced, validated."""
    if isinstance(base, str):
        if base not in PRESETS:
            raise TargetError(f"unknown target preset '{base}'; presets: {', '.join(sorted(PRESETS))}")
        base = PRESETS[base]
    values = {k: _coerce(k, v) for k, v in overrides.items()}
    return validate(dataclasses.replace(base, **values))


def load_target_file(path: str | os.PathLike) -> AscendTarget:
    """Read a JSON or TOML description. ``"base": "<preset>"`` inherits a preset; otherwise every field
    without a default must be given."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise TargetError(f"cannot read target file '{path}': {err.strerror}") from None
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as err:
        raise TargetError(f"target file '{path}' is not valid {path.suffix.lstrip('.').upper() or 'JSON'}: {err}") from None
    if not isinstance(data, dict):
        raise TargetError(f"target file '{path}' must hold an object of fields")
    data = dict(data)
    base = data.pop("base", None)
    if base is not None:
        return make_target(base, **data)
    required = [f.name for f in fields(AscendTarget)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in data]
    if missing:
        raise TargetError(f"target file '{path}' is missing field(s) {', '.join(missing)} "
                          f"(or give \"base\": one of {', '.join(sorted(PRESETS))})")
    values = {k: _coerce(k, v) for k, v in data.items()}
    return validate(AscendTarget(**values))


def get_target(spec: str | os.PathLike | AscendTarget | None = None, **overrides: Any) -> AscendTarget:
    """Resolve a preset name, a file path or an AscendTarget, then apply field overrides."""
    if spec is None:
        spec = "ascend910b"
    if isinstance(spec, AscendTarget):
        target = spec
    elif isinstance(spec, str) and spec in PRESETS:
        target = PRESETS[spec]
    elif Path(spec).suffix.lower() in (".json", ".toml") or Path(spec).exists():
        target = load_target_file(spec)
    else:
        raise TargetError(f"unknown target '{spec}': give a preset ({', '.join(sorted(PRESETS))}) "
                          "or a .json/.toml file")
    return make_target(target, **overrides) if overrides else validate(target)


def register_host_tags() -> None:
    """Register ``ascend/<preset>`` tags so ``tvm.target.Target("ascend/ascend910b")`` resolves."""
    from tvm.target.tag import register_tag

    for name, t in PRESETS.items():
        cfg = {"kind": "llvm", "keys": ["ascend", "cpu"], "model": t.name}
        register_tag(f"ascend/{name}", cfg, override=True)


def current_target_from_tvm() -> AscendTarget | None:
    """The preset named by the current TVM target's ``model`` attribute, if any."""
    import tvm

    tgt = tvm.target.Target.current(allow_none=True)
    if tgt is None:
        return None
    model = str(tgt.attrs.get("model", "")) if "model" in tgt.attrs else ""
    return PRESETS.get(model)

"""CANN-compatible fusion switches: which graph-fusion passes and UB-fusion patterns run.

Accepted forms (both as in CANN's ``--fusion_switch_file``):

* JSON: ``{"Switch": {"GraphFusion": {"ALL": "on", "ConvBatchnormFusionPass": "off"}, "UBFusion": {...}}}``
* flat: one ``PassName:on|off`` per line (``ALL:off`` applies to both kinds; ``#`` starts a comment).

A named pass overrides ``ALL`` of its kind. From TVM, ``PassContext(disabled_pass=[...])`` switches a pass
off and ``required_pass=[...]`` switches it on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SwitchError

GRAPH_FUSION = "GraphFusion"
UB_FUSION = "UBFusion"
CATEGORIES = (GRAPH_FUSION, UB_FUSION)


@dataclass(frozen=True)
class SwitchInfo:
    name: str
    category: str
    description: str
    default_on: bool = True


# Every switch name, as plain constants. Passes and pattern families import their name from here, so that
# knowing the switches never needs importing the passes, and no pass imports another layer for a name.

# graph fusion (graph_fusion/, one pass a file)
BATCHNORM_SCALE = "BatchnormScaleFusionPass"
CONCAT_IDENTITY = "ConcatIdentityFusionPass"
IDENTITY_COPY = "IdentityCopyFusionPass"
CONCAT_SPLIT = "ConcatSplitFusionPass"
CONV_SIBLING_MERGE = "ConvSiblingMergeFusionPass"
CONV_BRANCH_SUM = "ConvBranchSumFusionPass"
POOL_CONV_COMMUTE = "PoolConvCommuteFusionPass"
CONV_BATCHNORM = "ConvBatchnormFusionPass"
CONV_BIAS_ADD = "ConvBiasAddFusionPass"
FOCUS_CONV = "FocusConvFusionPass"
GELU = "GeluFusionPass"
LAYER_NORM = "LayerNormFusionPass"
MATMUL_BIAS_ADD = "MatMulBiasAddFusionPass"
MATMUL_SIBLING_MERGE = "MatMulSiblingMergeFusionPass"
RMS_NORM = "RMSNormFusionPass"
SOFTMAX = "SoftmaxFusionPass"
SWISH = "SwishFusionPass"
SDPA_ATTENTION = "ScaledDotProductAttentionFusionPass"
TRANSPOSE_CHAIN = "TransposeChainFusionPass"
GEMM_ROW_LAYOUT = "GemmRowLayoutFusionPass"
LAYOUT_CHAIN = "LayoutChainFusionPass"
ATTENTION_SCALE = "AttentionScaleFusionPass"
ATTENTION_MASK = "AttentionMaskFusionPass"
ATTENTION_KEY_PAD = "AttentionKeyPadFusionPass"
GROUPED_QUERY_MATMUL = "GroupedQueryMatmulFusionPass"
INCRE_FLASH_ATTENTION = "IncreFlashAttentionFusionPass"
PACKED_QKV = "PackedQkvFusionPass"
CONV1D_AS_CONV2D = "Conv1dAsConv2dFusionPass"
STATIC_SHAPE = "StaticShapeCanonicalizePass"
CONV2D_QUANT = "Conv2DQuantFusionPass"
DEPTHWISE_CONV2D_QUANT = "DepthwiseConv2DQuantFusionPass"
MATMUL_QUANT = "MatMulQuantFusionPass"
DYNAMIC_QUANT_MATMUL = "DynamicQuantMatMulFusionPass"
# UB fusion: pattern families (patterns/)
TBE_CONV_ELEMWISE = "TbeConvElemwiseFusionPass"
TBE_MATMUL_ELEMWISE = "TbeMatmulElemwiseFusionPass"
TBE_LAYER_NORM_MATMUL = "TbeLayerNormMatmulFusionPass"
TBE_RMS_NORM_MATMUL = "TbeRmsNormMatmulFusionPass"
TBE_ADD_LAYER_NORM = "TbeAddLayerNormFusionPass"
TBE_ADD_RMS_NORM = "TbeAddRmsNormFusionPass"
TBE_SOFTMAX = "TbeSoftmaxFusionPass"
TBE_ATTENTION = "TbeAttentionFusionPass"
TBE_SWIGLU = "TbeSwiGluFusionPass"
TBE_ELTWISE = "TbeEltwiseFusionPass"
TBE_SQUEEZE_EXCITE = "TbeSqueezeExciteFusionPass"
# UB fusion: the cost-based grouping (grouping/) and what it may put into one kernel
CHAINED_GEMM = "ChainedGemmFusionPass"
CHAINED_GEMM_HOST = "ChainedGemmHostCost"
SCHEDULE_RULE_CHECK = "ScheduleRuleCheck"
ATTENTION_PROJECTION = "AttentionProjectionFusionPass"
COST_BASED_FUSION = "CostBasedFusionPass"
TASK_PREFETCH = "TaskPrefetch"

SWITCHES: tuple[SwitchInfo, ...] = (
    SwitchInfo(BATCHNORM_SCALE, GRAPH_FUSION,
               "inference BatchNorm no conv/matmul absorbs -> x * scale + shift (per-channel constants), so it "
               "fuses into the next conv's input prologue"),
    SwitchInfo(CONV2D_QUANT, GRAPH_FUSION,
               "conv2d of a dequantized int8/uint8 activation and a dequantized int8 constant weight -> int8 "
               "conv with int32 accumulation, zero-point correction and scale as its epilogue"),
    SwitchInfo(DEPTHWISE_CONV2D_QUANT, GRAPH_FUSION,
               "depthwise conv2d of a dequantized int8/uint8 activation and a dequantized int8 constant weight "
               "-> depthwise conv on the integers (uint8 in, int32 accumulation), zero-point correction and "
               "scale as its epilogue"),
    SwitchInfo(MATMUL_QUANT, GRAPH_FUSION,
               "matmul/Gemm of a dequantized int8/uint8 activation and a dequantized int8 constant weight -> "
               "int8 GEMM with int32 accumulation, zero-point correction and scale as its epilogue"),
    SwitchInfo(DYNAMIC_QUANT_MATMUL, GRAPH_FUSION,
               "MatMulInteger of a dynamically quantized uint8 activation and an int8 constant weight (ORT "
               "quantize_dynamic) -> int8 GEMM with the run-time zero point's correction as its epilogue"),
    SwitchInfo(CONCAT_IDENTITY, GRAPH_FUSION, "a concat of one tensor is that tensor"),
    SwitchInfo(IDENTITY_COPY, GRAPH_FUSION,
               "a kernel call that copies its one input unchanged (a pad by zero) is that input"),
    SwitchInfo(CONCAT_SPLIT, GRAPH_FUSION,
               "split elementwise ops over concat inputs so each part fuses with its producer"),
    SwitchInfo(CONV_BATCHNORM, GRAPH_FUSION,
               "fold inference BatchNorm into the preceding conv2d/matmul weights and bias"),
    SwitchInfo(CONV_BIAS_ADD, GRAPH_FUSION,
               "merge constant per-channel adds after conv2d into one (1,C,1,1) bias add"),
    SwitchInfo(CONV_SIBLING_MERGE, GRAPH_FUSION,
               "convs sharing one input with constant weights and the same window -> one conv over "
               "concatenated output channels (+ bias, activation) and per-part channel slices"),
    SwitchInfo(CONV_BRANCH_SUM, GRAPH_FUSION,
               "a sum of convs of one input with constant weights and the same stride/groups/dilation (+ the "
               "input itself or a per-channel affine of it) -> one conv whose kernel is their centred sum "
               "(RepVGG/MobileOne blocks in training form)"),
    SwitchInfo(POOL_CONV_COMMUTE, GRAPH_FUSION,
               "an average pool next to a 1x1 conv moved to the side where the pair counts fewer operations "
               "(DenseNet's transition conv on the pooled pixels, Inception's pool branch over the conv's "
               "channels)"),
    SwitchInfo(FOCUS_CONV, GRAPH_FUSION, "YOLOv5 Focus (4 strided slices + concat + conv) -> one stride-2 conv"),
    SwitchInfo(GELU, GRAPH_FUSION, "recognise the erf and tanh forms of GELU as gelu / gelu_tanh"),
    SwitchInfo(LAYER_NORM, GRAPH_FUSION, "recognise mean/sub/pow/mean/add/sqrt/div(*gamma+beta) as layer_norm"),
    SwitchInfo(MATMUL_BIAS_ADD, GRAPH_FUSION,
               "fold constant weight transposes into matmul and merge its bias adds into one"),
    SwitchInfo(MATMUL_SIBLING_MERGE, GRAPH_FUSION,
               "matmuls sharing one input with constant weights -> one matmul over concatenated weights "
               "(+ concatenated bias) and per-part slices"),
    SwitchInfo(RMS_NORM, GRAPH_FUSION, "recognise x * rsqrt(mean(x^2) + eps) * gamma as rms_norm"),
    SwitchInfo(SOFTMAX, GRAPH_FUSION, "recognise exp(x - max) / sum(exp(...)) as softmax"),
    SwitchInfo(SWISH, GRAPH_FUSION, "recognise x * sigmoid(x) as silu"),
    SwitchInfo(SDPA_ATTENTION, GRAPH_FUSION,
               "write one-op attention (PyTorch SDPA) as Q.K^T, scale, mask, softmax, .V so the attention "
               "kernels fuse it with its projections"),
    SwitchInfo(TRANSPOSE_CHAIN, GRAPH_FUSION, "collapse consecutive transposes (permute_dims) into one, or none"),
    SwitchInfo(GEMM_ROW_LAYOUT, GRAPH_FUSION,
               "reshapes/transposes of a GEMM's rows moved off it: flattened GEMMs (GPT-2 Conv1D, ONNX Gemm) "
               "become batched, seq-first transposes (nn.MultiheadAttention) move into the head split/merge"),
    SwitchInfo(LAYOUT_CHAIN, GRAPH_FUSION,
               "any chain of layout ops (split, take, unsqueeze, squeeze, reshape, transpose) rewritten as the "
               "shortest slice -> reshape -> transpose -> reshape with the same effect"),
    SwitchInfo(ATTENTION_SCALE, GRAPH_FUSION,
               "scalar scales on Q and/or K before Q.K^T moved onto the score, where the attention kernel "
               "applies them"),
    SwitchInfo(ATTENTION_MASK, GRAPH_FUSION,
               "a boolean attention mask applied with where (where(keep, s, -inf), masked_fill) before softmax "
               "-> s + where(keep, 0, -inf): the additive mask the attention kernel takes (a constant mask, "
               "causal ones built in the graph included, folds to a constant); the NaN guard "
               "where(isnan(p), 0, p) after softmax(s + mask) dropped when the constant mask keeps a key in every row"),
    SwitchInfo(ATTENTION_KEY_PAD, GRAPH_FUSION,
               "an attention over a key count no 4-lane vector divides (ViT's 197) gets K, V and the score rows "
               "padded to whole 16-lane vectors, the padded keys masked out (exact)"),
    SwitchInfo(GROUPED_QUERY_MATMUL, GRAPH_FUSION,
               "grouped-query attention over a symbolic key count: the query heads sharing a KV head become "
               "rows of one product with it, so the repeated K and V are never written (exact)"),
    SwitchInfo(INCRE_FLASH_ATTENTION, GRAPH_FUSION,
               "a decode step's attention over a symbolic key count (a few query rows: scores, scale, mask, "
               "softmax, P.V) as one flash-decoding kernel: keys in chunks, each chunk's partial softmax on "
               "chip, the chunks merged with rescaling (exact in real arithmetic)"),
    SwitchInfo(PACKED_QKV, GRAPH_FUSION,
               "a packed Q|K|V in-projection (one GEMM cut into parts) written as one GEMM per part, which the "
               "sibling merge then merges as it does separate projections"),
    SwitchInfo(CONV1D_AS_CONV2D, GRAPH_FUSION,
               "conv1d (NCW) and its per-channel epilogue (bias, activation) written as a height-1 conv2d, "
               "so the conv patterns and the conv rule take it (Whisper's stem)"),
    SwitchInfo(STATIC_SHAPE, GRAPH_FUSION,
               "shape arithmetic on static tensors evaluated: dynamic slices/reshapes get static shapes "
               "(repairs models TVM cannot legalize)"),
    SwitchInfo(TBE_CONV_ELEMWISE, UB_FUSION,
               "conv2d + bias/batch_norm + activation (+ residual add) as one kernel: the epilogue runs on the "
               "cube's output block in UB"),
    SwitchInfo(TBE_MATMUL_ELEMWISE, UB_FUSION,
               "matmul + bias + activation (+ residual add) as one kernel: the epilogue runs on the accumulator "
               "block"),
    SwitchInfo(TBE_LAYER_NORM_MATMUL, UB_FUSION,
               "layer_norm feeding matmul (+ bias + activation) as one kernel: normalised rows are the cube "
               "operand"),
    SwitchInfo(TBE_RMS_NORM_MATMUL, UB_FUSION,
               "rms_norm feeding matmul (+ bias + activation) as one kernel: normalised rows are the cube "
               "operand"),
    SwitchInfo(TBE_ADD_LAYER_NORM, UB_FUSION,
               "residual add + layer_norm as one kernel (sum may be a 2nd output)"),
    SwitchInfo(TBE_ADD_RMS_NORM, UB_FUSION, "residual add + rms_norm as one kernel (sum may be a 2nd output)"),
    SwitchInfo(TBE_SOFTMAX, UB_FUSION, "scale (multiply/divide) and mask add feeding softmax as one kernel"),
    SwitchInfo(TBE_ATTENTION, UB_FUSION,
               "matmul(Q, K^T) * scale + mask -> softmax -> matmul(., V) as one kernel (score rows stay in UB)"),
    SwitchInfo(TBE_SWIGLU, UB_FUSION, "silu(gate) * up, optionally with the gate/up matmuls, as one kernel"),
    SwitchInfo(TBE_ELTWISE, UB_FUSION, "two or more elementwise ops in a row as one kernel"),
    SwitchInfo(TBE_SQUEEZE_EXCITE, UB_FUSION,
               "squeeze-and-excitation: global average pool -> 1x1 FC -> activation -> 1x1 FC -> sigmoid / "
               "hardsigmoid as one kernel (the channel-wise multiply goes into the next conv's input)"),
    SwitchInfo(CHAINED_GEMM, UB_FUSION,
               "cost-based grouping may chain two GEMMs (FFN up->down projection) in one kernel, per row block"),
    SwitchInfo(CHAINED_GEMM_HOST, UB_FUSION,
               "a chained GEMM must also beat two GEMM kernels on the CPU host the build runs on (weights "
               "re-streamed per row block beyond one per core, partial row blocks); off: the NPU model's answer"),
    SwitchInfo(SCHEDULE_RULE_CHECK, UB_FUSION,
               "cost-based grouping refuses a merge whose kernel only the fallback schedule rule would take, or a "
               "rule that schedules it worse than each of its parts (the rule table of rule_specs.py); off: the "
               "cost model alone decides"),
    SwitchInfo(ATTENTION_PROJECTION, UB_FUSION,
               "cost-based grouping may merge attention with its output projection (+ residual) and its query "
               "projection (+ norm), per block of query rows"),
    SwitchInfo(COST_BASED_FUSION, UB_FUSION,
               "cost-model grouping of the remaining ops into UB-fused kernels (replaces TVM FuseOps)"),
    SwitchInfo(TASK_PREFETCH, UB_FUSION,
               "each parallel task of a scheduled kernel prefetches the weights its next task reads and the lines "
               "its own epilogue reads (a residual), spread over its loops, so memory streams overlap compute"),
)

_BY_NAME: dict[str, SwitchInfo] = {s.name: s for s in SWITCHES}
_USER: dict[str, SwitchInfo] = {}    # switches of patterns and passes a user adds (``register_switch``)


def known_switches() -> dict[str, SwitchInfo]:
    return {**_BY_NAME, **_USER}


def register_switch(name: str, category: str, description: str = "", default_on: bool = True) -> str:
    """Declare the switch of a pattern or pass written outside this package (the built-in ones are the table
    above), so switch files and ``PassContext(disabled_pass=...)`` accept its name; returns the name.
    Declaring the same switch again is harmless; a name that is already taken otherwise is an error."""
    if category not in CATEGORIES:
        raise SwitchError(f"switch category {category!r} is not one of {', '.join(CATEGORIES)}")
    info = SwitchInfo(name, category, description, default_on)
    known = known_switches().get(name)
    if known is not None and (name in _BY_NAME or (known.category, known.default_on) != (category, default_on)):
        raise SwitchError(f"switch {name!r} is already declared ({known.category}: {known.description})")
    _USER[name] = info
    return name


def _parse_value(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "1"):
        return True
    if text in ("off", "false", "0"):
        return False
    raise SwitchError(f"switch '{name}' has value {value!r}; use \"on\" or \"off\"")


@dataclass
class FusionSwitches:
    """Resolved on/off state. ``overrides`` name passes; ``all_of`` holds a category-wide ``ALL``."""

    overrides: dict[str, bool] = field(default_factory=dict)
    all_of: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self):
        known = known_switches()
        unknown = sorted(n for n in self.overrides if n not in known)
        if unknown:
            raise SwitchError(
                f"unknown fusion pass name(s) {', '.join(unknown)}; valid names: {', '.join(sorted(known))}")

    def is_on(self, name: str) -> bool:
        info = known_switches().get(name)
        if info is None:
            raise SwitchError(f"unknown fusion pass name '{name}'")
        if name in self.overrides:
            return self.overrides[name]
        return self.all_of.get(info.category, info.default_on)

    def state(self) -> dict[str, bool]:
        return {name: self.is_on(name) for name in sorted(known_switches())}

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, data: dict) -> "FusionSwitches":
        """The JSON form (with or without the outer ``Switch`` key)."""
        if not isinstance(data, dict):
            raise SwitchError("fusion switch JSON must be an object")
        if "Switch" in data:
            extra = sorted(set(data) - {"Switch"})
            if extra:
                raise SwitchError(f"fusion switch JSON has unknown top-level key(s) {', '.join(extra)}")
            data = data["Switch"]
            if not isinstance(data, dict):
                raise SwitchError("\"Switch\" must be an object with GraphFusion / UBFusion sections")
        overrides, all_of = {}, {}
        for section, entries in data.items():
            if section not in CATEGORIES:
                raise SwitchError(f"unknown fusion switch section '{section}'; use {' or '.join(CATEGORIES)}")
            if not isinstance(entries, dict):
                raise SwitchError(f"section '{section}' must be an object of \"PassName\": \"on|off\"")
            for name, value in entries.items():
                if name.upper() == "ALL":
                    all_of[section] = _parse_value(f"{section}.ALL", value)
                else:
                    info = known_switches().get(name)
                    if info is not None and info.category != section:
                        raise SwitchError(f"'{name}' is a {info.category} pass, not {section}")
                    overrides[name] = _parse_value(name, value)
        return cls(overrides, all_of)

    @classmethod
    def from_flat(cls, text: str) -> "FusionSwitches":
        overrides, all_of = {}, {}
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if ":" not in line:
                raise SwitchError(f"fusion switch line {lineno} '{raw.strip()}' is not of the form PassName:on|off")
            name, value = (s.strip() for s in line.split(":", 1))
            if name.upper() == "ALL":
                flag = _parse_value("ALL", value)
                all_of = {c: flag for c in CATEGORIES}
            else:
                overrides[name] = _parse_value(name, value)
        return cls(overrides, all_of)

    @classmethod
    def from_text(cls, text: str) -> "FusionSwitches":
        stripped = text.lstrip()
        if stripped.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise SwitchError(f"fusion switch file is not valid JSON: {err}") from None
            return cls.from_mapping(data)
        return cls.from_flat(text)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "FusionSwitches":
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise SwitchError(f"cannot read fusion switch file '{path}': {err.strerror}") from None
        try:
            return cls.from_text(text)
        except SwitchError as err:
            raise SwitchError(f"{path}: {err}") from None

    def with_pass_context(self, ctx=None) -> "FusionSwitches":
        """Apply ``PassContext(disabled_pass=..., required_pass=...)`` on top (names we know only)."""
        import tvm

        ctx = ctx or tvm.transform.PassContext.current()
        known = known_switches()
        overrides = dict(self.overrides)
        for name in ctx.required_pass:
            if str(name) in known:
                overrides[str(name)] = True
        for name in ctx.disabled_pass:
            if str(name) in known:
                overrides[str(name)] = False
        return FusionSwitches(overrides, dict(self.all_of))


def resolve_switches(spec=None) -> FusionSwitches:
    """Accept None, a FusionSwitches, a dict (JSON form or ``{name: bool}``) or a file path."""
    if spec is None:
        return FusionSwitches()
    if isinstance(spec, FusionSwitches):
        return spec
    if isinstance(spec, dict):
        if "Switch" in spec or any(k in CATEGORIES for k in spec):
            return FusionSwitches.from_mapping(spec)
        return FusionSwitches({k: _parse_value(k, v) for k, v in spec.items()})
    return FusionSwitches.from_file(spec)

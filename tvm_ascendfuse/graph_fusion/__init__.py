"""Graph fusion: math-equivalent rewrites on high-level Relax ops, one switchable pass a file.

``GRAPH_FUSION_PASSES`` lists them in the order the pipeline runs them, and the order matters:

0. ``StaticShapeCanonicalizePass`` before everything: it evaluates shape arithmetic on static tensors, so a
   slice or reshape fed by ``Shape`` gets a static shape (and legalization can emit its kernel); the
   matchers below need static shapes too. ``IdentityCopyFusionPass`` right after it drops the kernel calls
   that have become plain copies with the static shapes (a shape-dependent ONNX Pad by zero: Swin), so no
   matcher or rule sees them.
   ``Conv2DQuantFusionPass``, ``DepthwiseConv2DQuantFusionPass``, ``MatMulQuantFusionPass`` and ``DynamicQuantMatMulFusionPass`` next, before anything reads weights: they need
   the quantized weights as the model stores them (int8 constants under ``dequantize``, which the
   pipeline's first constant fold keeps; the fold after the list turns the rest into float32 constants,
   and until then ``FunctionGraph.const`` reads a dequantized constant as its float32 value).
1. ``FocusConvFusionPass`` first of the rewrites: it replaces the Focus conv by a new stride-2 conv, so a BatchNorm after
   it is later folded into *that* conv.
2. ``ScaledDotProductAttentionFusionPass`` then ``TransposeChainFusionPass``: one-op attention (PyTorch
   SDPA) is written out as the chain an ONNX export has, and the importer's transposes around it collapse,
   before anything below looks for attention or Q/K/V siblings.
3. ``ConvBiasAddFusionPass`` / ``MatMulBiasAddFusionPass``: turn bias reshapes, swapped operands, chains of
   constant adds and ``permute_dims`` of constant weights (ONNX Gemm) into ``op(x, W_const) + b_const``, so
   that BN folding sees a constant weight and one constant bias.
4. The recognitions, ``LayerNormFusionPass`` before ``RMSNormFusionPass`` (the inner part of a decomposed
   LayerNorm, ``d / sqrt(mean(d^2) + eps) * gamma``, is itself an RMSNorm of ``d``), then GELU, Swish,
   Softmax (disjoint patterns); ``AttentionMaskFusionPass`` after Softmax turns a ``where`` mask in front of
   a softmax into an additive one. They come before the split so that it moves single ops (silu, gelu) and
   not their decompositions (``x * sigmoid(x)`` uses the concat twice, which the split refuses).
   ``Conv1dAsConv2dFusionPass`` after them: it carries a conv1d's activation (now one op) into 4-D with it.
5. ``ConcatSplitFusionPass``: moves elementwise ops and inference BatchNorm from a concat onto its parts.
6. ``ConvBatchnormFusionPass``: it folds every BN now sitting on a conv/matmul, including the ones
   the split just moved onto the parts of a concat (CSP blocks: ``concat(conv, conv) -> BN -> act``).
   ``ConcatIdentityFusionPass`` just before it drops one-input concats (DenseNet), so the split and the
   fold see the tensor itself.
7. ``BatchnormScaleFusionPass``: every BN left (not behind a conv/matmul: pre-activation BN) becomes a
   per-channel multiply-add the grouping can fuse into the next conv's input prologue.
7b. ``PoolConvCommuteFusionPass``: an average pool and a 1x1 conv next to each other swap when the other
   order counts fewer operations; after the BN folds (a folded bias is what may or may not cross the pool)
   and before the sibling merge, which then sees a pool branch's conv reading the block input beside the
   other branches' convs (it stays apart from them: a pool, not their activation, follows it).
8. ``ConvBranchSumFusionPass`` then ``ConvSiblingMergeFusionPass``. The first turns a sum of convs of one
   input (RepVGG/MobileOne branches, their BNs folded by step 6, the BN of the input made ``x * s + t`` by
   step 7) into one conv with the summed kernel; it must come before the sibling merge, which would otherwise
   concatenate those branches and add the slices back. Then ``ConvSiblingMergeFusionPass``: convs of one
   input (Inception's 1x1 branches) with folded weights and canonical biases become one conv and channel
   slices.
9. The transformer canonicalisations, in this order: ``GemmRowLayoutFusionPass`` moves reshapes/transposes
   of GEMM rows off the GEMMs (they need the canonical ``matmul(x, W) + b`` of step 3), then
   ``LayoutChainFusionPass`` rewrites every chain of layout ops, including the ones just moved, in the one
   canonical form (slice -> reshape -> permute -> reshape); ``AttentionScaleFusionPass`` moves scales of Q/K
   onto the score; ``PackedQkvFusionPass`` cuts a packed in-projection, now a GEMM read by slices, into one
   GEMM per part.
10. ``MatMulSiblingMergeFusionPass``: it needs canonical ``matmul(x, W_const) + b_const`` siblings
   (after the bias merge and any BN fold) and merges them into one matmul plus slices (Q/K/V).
11. ``AttentionKeyPadFusionPass`` after it: it pads K and V of an attention over an odd key count (the
   merge still sees the projections themselves).
12. ``GroupedQueryMatmulFusionPass``: grouped-query products over a symbolic key count (no attention
   pattern takes them) read each KV head once; it needs the scales already on the score (step 9).
13. ``IncreFlashAttentionFusionPass`` last: a decode attention over a symbolic key count, from its Q·Kᵀ
   product to its P·V product, becomes one flash-decoding kernel; it reads the products as step 12 leaves
   them (grouped-query heads stacked as rows).

The pipeline runs FoldConstant and DeadCodeElimination after the list.
"""

from .attention_key_pad import AttentionKeyPadFusionPass
from .attention_mask import AttentionMaskFusionPass
from .attention_op import ScaledDotProductAttentionFusionPass
from .attention_scale import AttentionScaleFusionPass
from .batchnorm_scale import BatchnormScaleFusionPass
from .concat_identity import ConcatIdentityFusionPass
from .concat_split import ConcatSplitFusionPass
from .conv_batchnorm import ConvBatchnormFusionPass
from .conv_branch_sum import ConvBranchSumFusionPass
from .conv1d import Conv1dAsConv2dFusionPass
from .conv_bias_add import ConvBiasAddFusionPass
from .conv_quant import Conv2DQuantFusionPass
from .depthwise_conv_quant import DepthwiseConv2DQuantFusionPass
from .conv_sibling_merge import ConvSiblingMergeFusionPass
from .focus_conv import FocusConvFusionPass
from .gelu import GeluFusionPass
from .gemm_row_layout import GemmRowLayoutFusionPass
from .grouped_query_matmul import GroupedQueryMatmulFusionPass
from .identity_copy import IdentityCopyFusionPass
from .incre_flash_attention import IncreFlashAttentionFusionPass
from .layer_norm import LayerNormFusionPass
from .layout_chain import LayoutChainFusionPass
from .matmul_bias_add import MatMulBiasAddFusionPass
from .matmul_quant import MatMulQuantFusionPass
from .matmul_integer import DynamicQuantMatMulFusionPass
from .matmul_sibling_merge import MatMulSiblingMergeFusionPass
from .packed_qkv import PackedQkvFusionPass
from .pool_conv_commute import PoolConvCommuteFusionPass
from .rms_norm import RMSNormFusionPass
from .softmax import SoftmaxFusionPass
from .static_shape import StaticShapeCanonicalizePass
from .swish import SwishFusionPass
from .transpose_chain import TransposeChainFusionPass

GRAPH_FUSION_PASSES: list = [
    StaticShapeCanonicalizePass,
    IdentityCopyFusionPass,
    Conv2DQuantFusionPass,
    DepthwiseConv2DQuantFusionPass,
    MatMulQuantFusionPass,
    DynamicQuantMatMulFusionPass,
    FocusConvFusionPass,
    ScaledDotProductAttentionFusionPass,
    TransposeChainFusionPass,
    ConvBiasAddFusionPass,
    MatMulBiasAddFusionPass,
    LayerNormFusionPass,
    RMSNormFusionPass,
    GeluFusionPass,
    SwishFusionPass,
    Conv1dAsConv2dFusionPass,
    SoftmaxFusionPass,
    AttentionMaskFusionPass,
    ConcatIdentityFusionPass,
    ConcatSplitFusionPass,
    ConvBatchnormFusionPass,
    BatchnormScaleFusionPass,
    PoolConvCommuteFusionPass,
    ConvBranchSumFusionPass,
    ConvSiblingMergeFusionPass,
    GemmRowLayoutFusionPass,
    LayoutChainFusionPass,
    AttentionScaleFusionPass,
    PackedQkvFusionPass,
    MatMulSiblingMergeFusionPass,
    AttentionKeyPadFusionPass,
    GroupedQueryMatmulFusionPass,
    IncreFlashAttentionFusionPass,
]

__all__ = ["GRAPH_FUSION_PASSES"] + [cls.__name__ for cls in GRAPH_FUSION_PASSES]

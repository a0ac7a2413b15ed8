"""Graph fusion: math-equivalent rewrites on high-level Relax ops, one switchable pass a file.

``GRAPH_FUSION_PASSES`` lists them in the order the pipeline runs them, and the order matters:

0. ``StaticShapeCanonicalizePass`` before everything: it evaluates shape arithmetic on static tensors, so a
   slice or reshape fed by ``Shape`` gets a static shape (and legalization can emit its kernel); the
   matchers below need static shapes too.
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
   Softmax (disjoint patterns). They come before the split so that it moves single ops (silu, gelu) and
   not their decompositions (``x * sigmoid(x)`` uses the concat twice, which the split refuses).
5. ``ConcatSplitFusionPass``: moves elementwise ops and inference BatchNorm from a concat onto its parts.
6. ``ConvBatchnormFusionPass``: it folds every BN now sitting on a conv/matmul, including the ones
   the split just moved onto the parts of a concat (CSP blocks: ``concat(conv, conv) -> BN -> act``).
7. ``MatMulSiblingMergeFusionPass`` last: it needs canonical ``matmul(x, W_const) + b_const`` siblings
   (after the bias merge and any BN fold) and merges them into one matmul plus slices (Q/K/V).

The pipeline runs FoldConstant and DeadCodeElimination after the list.
"""

from .attention_op import ScaledDotProductAttentionFusionPass
from .concat_split import ConcatSplitFusionPass
from .conv_batchnorm import ConvBatchnormFusionPass
from .conv_bias_add import ConvBiasAddFusionPass
from .focus_conv import FocusConvFusionPass
from .gelu import GeluFusionPass
from .layer_norm import LayerNormFusionPass
from .matmul_bias_add import MatMulBiasAddFusionPass
from .matmul_sibling_merge import MatMulSiblingMergeFusionPass
from .rms_norm import RMSNormFusionPass
from .softmax import SoftmaxFusionPass
from .static_shape import StaticShapeCanonicalizePass
from .swish import SwishFusionPass
from .transpose_chain import TransposeChainFusionPass

GRAPH_FUSION_PASSES: list = [
    StaticShapeCanonicalizePass,
    FocusConvFusionPass,
    ScaledDotProductAttentionFusionPass,
    TransposeChainFusionPass,
    ConvBiasAddFusionPass,
    MatMulBiasAddFusionPass,
    LayerNormFusionPass,
    RMSNormFusionPass,
    GeluFusionPass,
    SwishFusionPass,
    SoftmaxFusionPass,
    ConcatSplitFusionPass,
    ConvBatchnormFusionPass,
    MatMulSiblingMergeFusionPass,
]

__all__ = ["GRAPH_FUSION_PASSES"] + [cls.__name__ for cls in GRAPH_FUSION_PASSES]

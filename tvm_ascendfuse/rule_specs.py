"""What each schedule rule takes, declared as data, and which rule a (candidate) kernel would get.

The grouping pass merges what the NPU cost model likes; a merge is only worth making if a schedule rule
then takes the merged kernel at least as well as the parts (XLA's priority fusion asks its emitter the same
question; Inductor checks that a template exists). The grouping sits below the rules and must not import
them, so each rule declares here, in one ``RuleSpec``, the kernels it schedules, in the vocabulary of
``kinds.py``: a regular expression over the kernel's *kind string* (one letter per op in program order, e.g.
``"CEEP"`` for conv + bias + ReLU + max-pool) plus, for kernels with several products, whether those feed one
another (``chained``). ``predict_rule`` walks the table in the schedule phase's order and returns the first
spec that accepts: the rule the schedule phase will pick, without building a schedule.

A declaration must say no to what its rule declines (a group the grouping then makes would land on a worse
rule). ``tests/test_rule_specs.py`` compiles the workloads and a set of small graphs and asserts that the
predicted rule is the one the schedule phase picked for every kernel; the order of ``RULE_SPECS`` must be
``schedule/apply.py``'s ``DEFAULT_RULES`` order (also tested). What the table cannot see (symbolic extents,
dtypes, a schedule over on-chip capacity that the recovery moves to the next rule) is left to the schedule
phase, which still decides.

Ranks: how well a rule schedules what it takes. ``SPECIALISED`` rules tile a kernel's products, convs or
pools on chip; ``ROWS`` keeps rows of reductions in UB; ``STREAMING`` tiles injective chains; ``GENERIC``
(the fallback) only parallelises and vectorises loops. A merge whose kernel would rank below every part's
is refused (``no_schedule`` when the merged kernel would fall to the fallback rule, ``slower_schedule``
otherwise).

Adding a rule = one ``RuleSpec`` entry at the rule's position in ``DEFAULT_RULES``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from .kinds import CONV, GEMM, MULTI_PRODUCT, PLANE_POOL, POOL, PRODUCT, REDUCTION
from .tiling import GEMV_MAX_ROWS

GENERIC, STREAMING, ROWS, SPECIALISED = 0, 1, 2, 3

# kinds that count as products when asking whether a kernel's products feed one another (what the rules'
# ``is_product_block`` sees: a grouped or depthwise conv is not one)
PRODUCT_KINDS = frozenset(CONV + GEMM + PRODUCT + MULTI_PRODUCT)
REDUCTION_KINDS = frozenset(POOL + PLANE_POOL + REDUCTION)   # reductions that are not products


@dataclass(frozen=True)
class GroupShape:
    """What the rule table needs to know about a kernel: its ops' kinds in program order, and whether one of
    its products (transitively) reads another's result. An op other than the last whose value also leaves
    the kernel (a second output: a residual sum that is also normalised, a conv's activation that an SE
    block's mean also reads) is written in lower case: most rules place every block relative to one output
    and decline those."""

    kinds: str
    chained: bool = False
    rows: int | None = None      # the most rows per batch item of its GEMMs; None: symbolic, or no GEMM
    batched: bool = False        # a GEMM of several batch items (heads) whose B differs
    # a reduction (pool, plane mean, row reduction) that neither reads a product of the kernel nor feeds one,
    # and reads a value computed in the kernel: a sibling of the product that shares a computed input with it
    # (Inception-v3's max-pool branch beside its strided 3x3 conv, both reading the block's concat). The rules
    # that take a product and a reduction tile the reduction by the product's output (or the product by the
    # reduction's); such a sibling has no tile there. (A sibling pool of a kernel input, GoogLeNet's pool
    # branch beside its merged 1x1 convs, is staged from that input by the pool rule.)
    sibling_reduction: bool = False


@dataclass(frozen=True)
class RuleSpec:
    """One rule's declaration. ``takes``: a regular expression the whole kind string must match;
    ``chained``: True = the products must feed one another, False = they must not, None = either;
    ``max_rows``: the GEMMs must have static rows per batch item, at most this many (None: any);
    ``batched``: True = some GEMM has several batch items, False = none has, None = either;
    ``siblings``: the rule takes a reduction beside the products (``GroupShape.sibling_reduction``)."""

    name: str
    takes: str
    rank: int
    chained: bool | None = None
    note: str = ""
    max_rows: int | None = None
    batched: bool | None = None
    siblings: bool = False
    _regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_regex", re.compile(self.takes))

    def accepts(self, shape: GroupShape) -> bool:
        if self.chained is not None and shape.chained != self.chained:
            return False
        if self.max_rows is not None and (shape.rows is None or shape.rows > self.max_rows):
            return False
        if self.batched is not None and shape.batched != self.batched:
            return False
        if shape.sibling_reduction and not self.siblings:
            return False
        return self._regex.fullmatch(shape.kinds) is not None


# In DEFAULT_RULES order (schedule/apply.py). Letters: kinds.py; [EL] injective ops; lower case: an op whose
# value is also an output of the kernel (only where the rule handles a second output).
RULE_SPECS: tuple[RuleSpec, ...] = (
    # A whole recurrent layer is a kernel its converter writes (recurrent_layer, recurrence_kernel), never a
    # group the grouping makes from ops
    RuleSpec("recurrence", r"S", SPECIALISED, note="a recurrent layer with its step loop inside (converter-made); "
             "each step's weight panels over the cores"),
    # the flash-decoding kernel is a call of its own (IncreFlashAttentionFusionPass), never a group of ops
    RuleSpec("flash-decode", r"F", SPECIALISED, note="a decode attention over a run-time key count in chunks "
             "of keys (IncreFlashAttentionFusionPass's kernel), one task per chunk, then the chunks merged"),
    RuleSpec("squeeze-excite", r"[EL]*M[EL]*[CG][EL]*[CG][EL]*", SPECIALISED,
             note="whole-plane mean -> FC (1x1 conv or matmul) -> activation -> FC -> gate"),
    RuleSpec("gemv", r"[ELR]*G([EL]*G)*[ELRMelrm]*", SPECIALISED, chained=False, max_rows=GEMV_MAX_ROWS,
             batched=False,
             note="products of a few rows (a decode step): the weight streamed in panels, one per task; a row "
                  "norm before or after them computed once"),
    RuleSpec("decode-attention", r"[EL]*G[EL]*R[ELR]*G[EL]*", SPECIALISED, chained=True, max_rows=GEMV_MAX_ROWS,
             note="attention of a few query rows per head over the keys (a decode step), one task per head"),
    RuleSpec("row-dot", r"[EL]*L[EL]*G[EL]*", SPECIALISED, chained=False, max_rows=GEMV_MAX_ROWS, batched=True,
             note="a few rows dotted with every row of a run-time matrix, per head (decode attention scores over "
                  "a cache whose length is known at run time: Kᵀ is the layout prologue), the key rows read in "
                  "place, chunks of them per task"),
    RuleSpec("attention-projection", r"[ELR]*(G[EL]*)?(T|G[EL]*R[ELR]*G)[EL]*G[ELR]*", SPECIALISED, chained=True,
             note="attention with its output projection (and query projection, norms) per block of query rows"),
    RuleSpec("attention", r"[EL]*(T|G[EL]*R[ELR]*G)[EL]*", SPECIALISED, chained=True,
             note="two products with a row softmax between them"),
    RuleSpec("chained-matmul", r"[EL]*(R[EL]*)?G(E*G)?E*G[EL]*(R[EL]*)?", SPECIALISED, chained=True,
             note="first product(s) -> elementwise -> second product (+ injective, + row norm), per row block"),
    RuleSpec("multi-matmul", r"[EL]*G[EL]*(G[EL]*)+", SPECIALISED, chained=False,
             note="independent products combined elementwise (SwiGLU)"),
    # The int8 rules take the kernels of the quantized passes (int8 operands, int32 accumulation): the kinds do
    # not carry operand dtypes, so the table predicts the float rule for them (same rank), never these.
    RuleSpec("matmul_int8", r"(?!)", SPECIALISED, note="one int8 GEMM (u8 x s8 -> s32, VNNI where the host has "
             "it) + requantize/dequantize epilogue; predicted as matmul"),
    # The bf16 rule takes the GEMMs of kernels a bf16 build marks (precision/on_chip.py) on hosts with
    # AVX512-BF16: neither is in the kinds, so the table predicts the float rule for them (same rank).
    RuleSpec("matmul_bf16", r"(?!)", SPECIALISED, note="one float32 GEMM of a bf16 build (constant weight) on "
             "the host's bf16 dot product (AVX512-BF16) + injective epilogue; predicted as matmul"),
    RuleSpec("matmul", r"[ELRel]*G[ELel]*", SPECIALISED,
             note="one GEMM, injective or row-norm prologue, injective epilogue (with several outputs: the "
                  "slices of a merged sibling projection)"),
    RuleSpec("conv2d_int8", r"(?!)", SPECIALISED, note="one int8 conv2d (u8 x s8 -> s32) + epilogue; predicted "
             "as conv2d"),
    RuleSpec("conv2d-padded", r"(?!)", SPECIALISED, note="one conv2d whose output channels no full vector "
             "divides, computed with them padded to the vector width (the padded lanes never stored); predicted "
             "as conv2d"),
    RuleSpec("conv2d", r"[ELel]*C[ELel]*", SPECIALISED, note="one conv2d (groups=1), injective prologue/epilogue"),
    RuleSpec("grouped-conv2d", r"[ELel]*Q([ELel]*|[ELel]*[el]M[EL]*)", SPECIALISED,
             note="one grouped conv2d + injective epilogue, and the global pool of its output (an SE's mean)"),
    RuleSpec("depthwise-conv2d", r"[EL]*D([EL]*|[EL]*[el]M[EL]*)", SPECIALISED,
             note="one depthwise conv2d + per-tile epilogue, and the global pool of its output (an SE's mean)"),
    RuleSpec("pool", r"[ELel]*(C[ELel]*)?[PM][EL]*", SPECIALISED,
             note="one pool, alone or after one conv2d (whose epilogue may also be an output)"),
    RuleSpec("matmul+norm", r"[EL]*[GK][EL]*e?[RPM][ELRPM]*", SPECIALISED,
             note="one GEMM whose output feeds row reductions; the sum in front of the norm may be an output "
                  "(not a conv: its window reductions get no register tile there)"),
    # Not a depthwise/grouped conv whose output is permuted before a row reduction reads it (ConvNeXt: 7x7
    # depthwise conv -> channels-last -> LayerNorm): the rows are pixels across the conv's channel planes, and
    # no row tile of that kernel is a tile of the conv (2 GFLOP/s at 7x7x320, or over UB at 14x14x160).
    RuleSpec("reduction", r"(?![ELRQPM]*[DQ][EL]*L[EL]*R)[ELRDQPM]*[RDQPM][ELRDQPM]*", ROWS,
             note="reductions that are not products, sharing one row space, one output (norms, softmax, sums; "
                  "a grouped or depthwise conv, a pool, and what reduces their output)"),
    RuleSpec("elementwise", r"[ELel]*[EL]", STREAMING, note="injective chains, any number of outputs"),
    RuleSpec("fallback", r".*", GENERIC, siblings=True, note="anything: parallel outer loops, vectorised inner loop"),
)

FALLBACK = RULE_SPECS[-1]


def spec(name: str) -> RuleSpec:
    """The declaration of the rule called ``name``."""
    for s in RULE_SPECS:
        if s.name == name:
            return s
    raise KeyError(name)


@lru_cache(maxsize=4096)
def predict_rule(shape: GroupShape) -> RuleSpec:
    """The first declared rule that takes a kernel of this shape (the fallback takes anything)."""
    for s in RULE_SPECS:
        if s.accepts(shape):
            return s
    return FALLBACK


def group_shape(kinds, producers, outputs=(), rows=()) -> GroupShape:
    """The shape of a group of ops: ``kinds`` one letter per op in program order, ``producers[i]`` the
    positions (within the group) of the ops op ``i`` reads, ``outputs`` the positions whose values leave the
    group (the last op's always does), ``rows[i]`` op ``i``'s ``kinds.product_rows`` when it is a GEMM."""
    last = len(kinds) - 1
    kinds = "".join(k.lower() if i in outputs and i != last else k for i, k in enumerate(kinds))
    products = [i for i, k in enumerate(kinds) if k.upper() in PRODUCT_KINDS]
    below: dict[int, set] = {}                  # op -> the ops it reads, transitively
    for i in range(len(kinds)):                 # program order: producers come first
        up = set()
        for p in producers[i]:
            up |= {p} | below.get(p, set())
        below[i] = up
    chained = len(products) > 1 and any(set(products) & below[i] for i in products)
    sibling = bool(products) and any(
        k.upper() in REDUCTION_KINDS and below[i] and not set(products) & below[i]
        and not any(i in below[p] for p in products) for i, k in enumerate(kinds))
    gemm_rows = [r for k, r in zip(kinds, rows) if k == GEMM] if rows else [None]
    most = None if not gemm_rows or None in gemm_rows else max(r[0] for r in gemm_rows)
    batched = any(r is not None and r[1] > 1 for r in gemm_rows)
    return GroupShape(kinds, chained, most, batched, sibling)

"""``torch.compile(model, backend="ascendfuse")``: a TorchDynamo backend.

    import tvm_ascendfuse.torch_compile                       # registers the name (so does the entry point)
    fast = torch.compile(model, backend="ascendfuse", options={"target": "ascend910b"})
    with torch.no_grad():
        y = fast(x)                                           # torch tensors in and out

Dynamo hands the backend one FX graph per piece of the program it could trace (a graph break ends a piece)
and the piece's example inputs. The backend returns at once; each piece is built on its first call, with
that call's tensors (``LazyPiece``), and goes:

1. **FX graph -> plain module.** With dynamo's inlined ``nn.Module``s the module's parameters and buffers
   arrive as graph inputs (marked static by dynamo); they become attributes of the module again, so the
   importer binds them as constants and the pipeline can fold BatchNorm into them and lay weights out once.
   A ``SymInt`` input (a dynamic size, ``dynamic=True`` / ``mark_dynamic``) is rewritten as the size of the
   input tensor that carries the same symbol, so the module takes tensors only.
2. **torch.export -> Relax** (``torch_frontend.import_exported_program``, the same import ``from_torch`` does):
   every dim dynamo made symbolic is exported as a dynamic dim and arrives as a ``tirx.Var`` of ``main``'s
   signature, so one build serves every size that passes dynamo's guards.
3. **compile_model** (our pipeline) -> a VM, called with the torch tensors through DLPack (no copy for
   contiguous, 64-byte aligned tensors) and returning torch tensors made from the VM's outputs (no copy).

Builds are cached in the process, keyed on the imported module's structure (weights included) and the
options: a recompile of the same piece (a guard failing for another reason, ``torch._dynamo.reset()``, a
second ``torch.compile`` of the same model) reuses the build. A piece the import cannot translate, or that
our pipeline cannot build, runs in eager PyTorch (``gm.forward``) with one logged line; so does a training
call (the backend is inference only: gradients would not flow through the VM).

The weights are bound at compile time. Dynamo does not guard on the identity of inlined modules' parameters
(two instances of one class share the compiled code), so every call checks that the weights passed are the
ones the build holds (the same tensors, not modified in place since) and builds for them if not; each set of
weights keeps its build.

``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` reach the backend (and the layer kernel of ``torch_recurrent``) only
with ``torch._dynamo.config.allow_rnn = True``: by default dynamo breaks the graph at an RNN module and
runs it in eager PyTorch.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections import Counter
from dataclasses import dataclass, field

from .errors import ModelError, OptionError, UnsupportedOpError

log = logging.getLogger(__name__)

BACKEND_NAME = "ascendfuse"
OPTION_KEYS = ("target", "switches", "verify", "precision_mode", "portable", "jobs")

# counts of what the backend did in this process (tests and users read them: a recompile shows as a second
# "backend_calls"; "builds" counts compile_model runs, "cache_hits" builds reused)
stats: Counter = Counter()

_CACHE: dict = {}           # build key -> CompileResult
_CACHE_LIMIT = 64
_VARIANT_LIMIT = 8          # builds of one piece for different weights (module instances sharing code)
_LOCK = threading.Lock()


def _torch():
    try:
        import torch
    except ImportError:
        raise ModelError("PyTorch is not installed; install the extra: pip install 'tvm_ascendfuse[torch]'") from None
    return torch


# ---- options -----------------------------------------------------------------------------------------------
@dataclass
class BackendOptions:
    target: object = "ascend910b"
    switches: object = None
    verify: bool = False
    precision_mode: str | None = None
    portable: bool = False
    jobs: int | None = None
    extra: dict = field(default_factory=dict)   # keys passed to compile_model as they are (precision_mode)

    @classmethod
    def parse(cls, options) -> "BackendOptions":
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTION_KEYS))
        if unknown:
            raise OptionError(f"unknown torch.compile option(s) {unknown} for backend '{BACKEND_NAME}'; "
                              f"known: {list(OPTION_KEYS)}")
        opts = cls(**{k: options[k] for k in OPTION_KEYS if k in options})
        if not isinstance(opts.verify, bool):
            raise OptionError(f"option 'verify' must be True or False, got {opts.verify!r}")
        if opts.precision_mode is not None:
            from .api import compile_model

            if "precision_mode" not in inspect.signature(compile_model).parameters:
                raise OptionError(f"option precision_mode={opts.precision_mode!r}: this version of tvm_ascendfuse's "
                                  "compile_model has no precision modes; leave the option out")
            opts.extra["precision_mode"] = opts.precision_mode
        # a bad target or switch file is the caller's error: say so now, not as a silent eager fallback
        from .switches import resolve_switches
        from .target import get_target

        opts.target = get_target(opts.target)
        resolve_switches(opts.switches)
        return opts

    def key(self) -> tuple:
        return (repr(self.target), repr(self.switches), self.portable, tuple(sorted(self.extra.items())))


# ---- FX graph -> a module of tensors only ------------------------------------------------------------------
@dataclass
class _Plan:
    module: object            # torch.fx.GraphModule taking the tensor inputs only
    tensor_args: list         # positions, in dynamo's argument list, of the tensors the module takes
    weight_args: list         # positions of the weights bound as constants
    scalar_args: list         # positions of Python numbers dynamo passes as 0-d tensors, bound as constants
    dynamic_dims: list        # per tensor input: {dim: symbol name} of its symbolic dims
    n_ops: int


class _Untranslatable(Exception):
    """A piece this backend leaves to eager PyTorch (the message says why)."""


def _is_weight(torch, value) -> bool:
    return isinstance(value, torch.nn.Parameter) or getattr(value, "_dynamo_static_input_type", None) is not None


def _symbol(torch, value):
    """The sympy expression of a symbolic int, None for a plain int."""
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        return None if expr.is_number else expr
    return None


def _fetch(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def scalar_inputs(gm) -> list:
    """Per graph input: whether dynamo passes it as a 0-d tensor standing for a Python number. Read while the
    backend runs: dynamo drops the placeholders' ``grapharg`` once the backend has returned."""
    return [bool(getattr(n.meta.get("grapharg"), "pass_arg_as_tensor", False))
            for n in gm.graph.nodes if n.op == "placeholder"]


def plan_graph(gm, example_inputs, scalar_flags=None) -> _Plan:
    """The module ``torch.export`` gets: weights as attributes, sizes read off the tensors (module docstring).
    ``scalar_flags``: ``scalar_inputs(gm)`` taken while the backend ran."""
    torch = _torch()
    import torch.fx as fx

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    scalar_flags = scalar_flags or scalar_inputs(gm)
    if len(placeholders) != len(example_inputs):
        raise _Untranslatable(f"{len(placeholders)} graph inputs but {len(example_inputs)} example inputs")
    graph, env, attrs = fx.Graph(), {}, {}
    tensors, weights, scalars, symints, dynamic_dims = [], [], [], [], []
    scalar_nodes = {}
    for pos, (node, value) in enumerate(zip(placeholders, example_inputs)):
        example = node.meta.get("example_value", value)
        if isinstance(value, torch.Tensor) and scalar_flags[pos] and value.dim() == 0:
            # a Python float/int attribute (an epsilon, a scale) dynamo did not specialise: bound as a
            # constant like the weights (and checked like them on every call); `.item()` of it is the number
            name = f"_c{len(scalars)}"
            attrs[name] = value.detach().clone()
            env[node] = graph.get_attr(name)
            scalar_nodes[node] = value.item()
            scalars.append(pos)
        elif isinstance(value, torch.Tensor) and _is_weight(torch, value):
            name = f"_w{len(weights)}"
            attrs[name] = torch.nn.Parameter(value.detach(), requires_grad=False)
            env[node] = graph.get_attr(name)
            weights.append(pos)
        elif isinstance(value, torch.Tensor):
            env[node] = graph.placeholder(node.name)
            env[node].meta.update(node.meta)
            shape = example.shape if isinstance(example, torch.Tensor) else value.shape
            dynamic_dims.append({d: str(_symbol(torch, s)) for d, s in enumerate(shape)
                                 if _symbol(torch, s) is not None})
            tensors.append((pos, node, shape))
        elif isinstance(value, (int, torch.SymInt)) and _symbol(torch, example if example is not None else value):
            symints.append((node, _symbol(torch, example if example is not None else value)))
        elif isinstance(value, (int, torch.SymInt)):
            env[node] = int(value)    # a size dynamo passed as an input but kept static: a constant
        else:
            raise _Untranslatable(f"graph input '{node.name}' is a {type(value).__name__}, not a tensor or size")
    for node, expr in symints:
        carrier = next(((tn, d) for _, tn, shape in tensors for d, s in enumerate(shape)
                        if _symbol(torch, s) == expr), None)
        if carrier is None and not node.users:
            env[node] = None
            continue
        if carrier is None:
            raise _Untranslatable(f"dynamic size '{node.name}' ({expr}) is not a dimension of any input tensor")
        env[node] = graph.call_function(torch.ops.aten.sym_size.int, (env[carrier[0]], carrier[1]))
    n_ops = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op in ("get_attr", "call_module"):
            attrs[node.target] = _fetch(gm, node.target)
        if node.op.startswith("call_"):
            n_ops += 1
        if _is_item(torch, node) and node.args[0] in scalar_nodes:
            env[node] = scalar_nodes[node.args[0]]
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    return _Plan(fx.GraphModule(attrs, graph), [p for p, _, _ in tensors], weights, scalars, dynamic_dims, n_ops)


def _is_item(torch, node) -> bool:
    if node.op == "call_method":
        return node.target == "item"
    return node.op == "call_function" and node.target in (torch.Tensor.item, torch.ops.aten.item.default)


def import_plan(plan: _Plan, example_inputs):
    """``torch.export`` of the planned module (dynamo's symbolic dims exported as dynamic) -> Relax."""
    torch = _torch()
    from .torch_frontend import import_exported_program

    # copies: export traces with the tensors it is given, and whatever it records on them must not reach the
    # caller's tensors, which dynamo keeps guarding
    args = tuple(example_inputs[p].detach().clone() for p in plan.tensor_args)
    dynamic = tuple({d: torch.export.Dim.DYNAMIC for d in dims} or None for dims in plan.dynamic_dims)
    try:
        with torch.no_grad():
            program = torch.export.export(plan.module, args, dynamic_shapes=dynamic if any(dynamic) else None,
                                          strict=False)
    except Exception as err:  # noqa: BLE001 - export raises many types (UserError, GuardOnDataDependent...)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise _Untranslatable(f"torch.export failed: {type(err).__name__}: {first[:200]}") from None
    try:
        return program, import_exported_program(program)
    except (ModelError, UnsupportedOpError) as err:
        raise _Untranslatable(str(err)) from None


# ---- the build and the callable ----------------------------------------------------------------------------
def _build(mod, opts: BackendOptions, program):
    """compile_model, or the cached build of a structurally equal module with the same options."""
    import tvm_ffi

    from .api import compile_model

    key = (tvm_ffi.structural_hash(mod), opts.key())
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None and tvm_ffi.structural_equal(hit[0], mod):
        stats["cache_hits"] += 1
        return hit[1]
    kwargs = dict(target=opts.target, switches=opts.switches, portable=opts.portable, jobs=opts.jobs, **opts.extra)
    if opts.verify:
        from .verify import torch_reference

        kwargs.update(verify=True, reference=torch_reference(program), reference_name="pytorch (eager)")
    result = compile_model(mod, **kwargs)
    stats["builds"] += 1
    if opts.verify and not result.verification.ok:
        from .verify import verify_text

        raise _Untranslatable("the build does not match eager PyTorch: "
                              + " | ".join(verify_text(result.report.sections["verify"]).splitlines()[:3]))
    with _LOCK:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (mod, result)
    return result


def _flatten(value) -> list:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return [value]
    out = []
    for v in value:
        out += _flatten(v)
    return out


def _to_tvm(torch, tvm, t):
    """A torch tensor as a TVM tensor on the same memory; TVM's kernels assume dense rows starting on a
    64-byte boundary, so a view that is not gets copied once."""
    if not t.is_contiguous() or t.data_ptr() % 64:
        t = t.clone(memory_format=torch.contiguous_format)
    return tvm.runtime.from_dlpack(t.detach())


def _version(t):
    try:
        return t._version
    except RuntimeError:   # inference tensors have no version counter (and cannot be modified in place)
        return None


def _bound_signature(args, plan) -> tuple:
    """What the build holds as constants: each scalar's value, each weight's identity and version (an
    in-place update bumps it). Identities stay unique because the piece keeps the weights it was built from
    (``CompiledPiece._weights``); checked on every call, so kept cheap (~70 us for ResNet-50's 320 tensors,
    against ~230 us reading storage pointers and shapes)."""
    return (tuple(args[p].item() for p in plan.scalar_args),
            tuple((id(args[p]), _version(args[p])) for p in plan.weight_args))


class CompiledPiece:
    """One dynamo piece built by our pipeline: called with dynamo's arguments, returns torch tensors."""

    def __init__(self, gm, example_inputs, opts: BackendOptions, plan: _Plan, program, result, scalar_flags):
        import tvm
        from tvm import relax

        torch = _torch()
        self._torch, self._tvm = torch, tvm
        self.gm, self.opts, self.plan, self.result, self.scalar_flags = gm, opts, plan, result, scalar_flags
        self.out_spec = program.call_spec.out_spec
        self.bound = _bound_signature(example_inputs, plan)
        self._weights = [example_inputs[p] for p in plan.weight_args]   # keeps the identities in `bound` unique
        self._vm = relax.VirtualMachine(result.executable, tvm.cpu())
        self._main = self._vm["main"]
        self._variants = None   # bound signature -> CompiledPiece, once a second set of weights was seen

    def __call__(self, *args):
        if _bound_signature(args, self.plan) != self.bound:
            return self._other_weights(args)
        return self._run_vm(args)

    def _run_vm(self, args):
        torch = self._torch
        outs = self._main(*[_to_tvm(torch, self._tvm, args[p]) for p in self.plan.tensor_args])
        flat = [torch.from_dlpack(o) for o in _flatten(outs)]
        if self.out_spec is None:
            return flat[0] if len(flat) == 1 else flat
        return torch.utils._pytree.tree_unflatten(flat, self.out_spec)

    def _other_weights(self, args):
        """Weights (or numbers) other than the build's: their own build, kept beside this one, so instances
        sharing dynamo's code each run on theirs."""
        variants = self._variants = self._variants or {self.bound: self}
        sig = _bound_signature(args, self.plan)
        piece = variants.get(sig)
        if piece is None:
            log.info("%s: the weights or numbers passed differ from the build's (another module instance or an "
                     "in-place update); building for them", BACKEND_NAME)
            piece = _compile_or_eager(self.gm, args, self.opts, self.scalar_flags)
            if len(variants) >= _VARIANT_LIMIT:
                variants.pop(next(k for k in variants if variants[k] is not self))
            variants[sig] = piece
        return piece(*args)


def _compile_piece(gm, example_inputs, opts: BackendOptions, scalar_flags):
    plan = plan_graph(gm, example_inputs, scalar_flags)
    program, mod = import_plan(plan, example_inputs)
    try:
        result = _build(mod, opts, program)
    except _Untranslatable:
        raise
    except Exception as err:  # noqa: BLE001 - a build that fails must cost the piece our kernels, not the call
        first = (str(err).strip().splitlines() or [""])[-1].strip()[:300]
        raise _Untranslatable(f"the build failed: {type(err).__name__}: {first}") from None
    return CompiledPiece(gm, example_inputs, opts, plan, program, result, scalar_flags)


def _compile_or_eager(gm, args, opts: BackendOptions, scalar_flags):
    """Our build of the piece, or its eager ``forward`` with one logged line saying why."""
    try:
        return _compile_piece(gm, list(args), opts, scalar_flags)
    except _Untranslatable as err:
        stats["eager"] += 1
        log.warning("%s: %s runs in eager PyTorch: %s", BACKEND_NAME, _describe(gm), err)
        return gm.forward


def _describe(gm) -> str:
    ops = [n for n in gm.graph.nodes if n.op.startswith("call_")]
    return f"graph of {len(ops)} ops"


class LazyPiece:
    """What the backend returns: the piece is exported and built on its first call, with that call's tensors.

    Not inside the backend call itself: there dynamo's tracing context (its fake tensors and shape
    environment) is still active, ``torch.export`` records into it, and the guards dynamo then builds for
    the frame fail on the frame that created them."""

    def __init__(self, gm, opts: BackendOptions):
        self.gm, self.opts, self._run = gm, opts, None
        self.scalar_flags = scalar_inputs(gm)

    def __call__(self, *args):
        if self._run is None:
            self._run = _compile_or_eager(self.gm, args, self.opts, self.scalar_flags)
        return self._run(*args)

    @property
    def compiled(self) -> bool:
        """True once built by our pipeline (False before the first call and for a piece left to eager)."""
        return isinstance(self._run, CompiledPiece)


def _training(torch, example_inputs) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def ascendfuse_backend(gm, example_inputs, options=None, mode=None):
    """The dynamo backend: ``torch.compile(model, backend=ascendfuse_backend, options={...})`` or, once
    registered, ``backend="ascendfuse"``. ``options``: ``target`` (preset name, file or AscendTarget),
    ``switches`` (as ``compile_model`` takes them), ``verify`` (check each build against eager PyTorch on
    seeded inputs; a mismatch runs the piece eagerly), ``precision_mode`` (passed to ``compile_model``),
    ``portable`` and ``jobs``. ``mode`` (torch.compile's) is accepted and has no effect."""
    torch = _torch()
    stats["backend_calls"] += 1
    opts = BackendOptions.parse(options)
    if _training(torch, example_inputs):
        stats["eager"] += 1
        log.warning("%s is inference only: %s runs in eager PyTorch because gradients are enabled and an input "
                    "or weight requires grad (call the model under torch.no_grad() or torch.inference_mode())",
                    BACKEND_NAME, _describe(gm))
        return gm.forward
    return LazyPiece(gm, opts)


def clear_cache() -> None:
    """Forget the cached builds and the counts (``stats``)."""
    with _LOCK:
        _CACHE.clear()
    stats.clear()


def _entry_point_installed() -> bool:
    from importlib.metadata import entry_points

    return BACKEND_NAME in entry_points(group="torch_dynamo_backends").names


def register() -> bool:
    """Register the backend under the name ``ascendfuse`` with dynamo; True if this call registered it.

    An installed package needs none of this: dynamo finds the name through the ``torch_dynamo_backends``
    entry point and registers what it loads. It is for a source tree on ``PYTHONPATH`` (no entry point), and
    leaves the name alone when the entry point exists, since dynamo's lookup asserts that the name it is
    about to register from the entry point is not registered yet."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if BACKEND_NAME in _COMPILER_FNS or _entry_point_installed():
        return False
    register_backend(ascendfuse_backend, name=BACKEND_NAME)
    return True


try:  # importing the module registers the name, so `backend="ascendfuse"` works without the installed entry point
    register()
except ImportError:
    pass

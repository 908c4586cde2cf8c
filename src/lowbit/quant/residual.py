"""A quantized residual stream, modeled in training: `lowbit.quantize(..., residual_bits=8)`.

Integer-only inference keeps the values that residual adds read (the stream between blocks,
and the shortcut of a block whose shortcut changes the scale, such as a 1x1 stride-2
downsampling conv) in a narrow integer format with their own scale, as TensorRT's Q/DQ
placement does. Here the fake-quant model quantizes them itself, so that QAT trains with
them and the compiled network realizes the model's own arithmetic: each such value is the
output of a module (a residual block, a downsampling branch, a pool) and gets a
`ResidualQuantizer` as that module's `residual_quant` child, applied by a forward hook to
the module's output.

`residual_points(model)` finds them from a torch.fx trace (`lowbit.graph` later traces the
hooks as `residual_quant` calls): for every add of two tensors, its result (or the ReLU that
alone reads it) and the add's shortcut operand (the operand fewer conv / linear layers away
from the block's input: the identity or the downsampling branch; the other operand is the
block's last conv, whose kernel adds the shortcut in its epilogue). A value that is no
module's output on every call (a functional op, a module called more than once) is left to
the engine's wide realization, and `residual_points` says why.

The same machinery quantizes the input of an activation function (hardswish, SiLU, sigmoid,
GELU, ...) that reads a quantized conv / linear (`lowbit.quantize(..., activation_bits=8)`,
`activation_points`): a `ValueQuantizer` as the activation module's `input_quant` child,
applied by a forward pre-hook (or, for a functional activation, as the `residual_quant` of
the module whose output it reads), so that the compiled network computes the activation
exactly as a table over the at most 256 quantized values. A product of such an activation
with a feature map (squeeze-excite: `sigmoid(fc2(...)) * x`) gets its map operand quantized
too where the map is a quantized conv / linear's output through BatchNorm and ReLU / ReLU6
(MobileNet-V3's ReLU blocks, RegNet-Y): the quantizer of the module writing the map, so that
the product is a table of two quantized values, as EfficientNet's SiLU map already is. Every
such quantizer is a `ValueQuantizer` (`ResidualQuantizer` is the same class);
`value_quantizers` lists them all.
"""

from __future__ import annotations

import fnmatch
import operator
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ..core import Precision, WidePrecision
from .modules import QUANT_MODULES, ActQuantizer, activation_precision

#: widths of a residual stream: narrow (one value per byte) or 16-bit (signed, int16)
RESIDUAL_BITS = (4, 8, 16)
#: the attribute of a module holding the quantizer of its output
ATTR = "residual_quant"
#: the attribute of a module holding the quantizer of its (first) input
INPUT_ATTR = "input_quant"
#: where a quantizer sits on its module: the attribute holding it
ATTRS = {"output": ATTR, "input": INPUT_ATTR}
_ADDS = {"add", "add_", "__add__", "__iadd__", "iadd"}


class ValueQuantizer(ActQuantizer):
    """The fake-quantizer of one value a module writes or reads (a residual-stream value, an
    activation's input; module docstring): an activation quantizer of 2 to 8 bits (unsigned
    after a ReLU, else signed), or 16 bits (signed: the engine stores it as int16)."""

    def __init__(self, bits: int, method: str = "max", **options: object) -> None:
        signed = True if bits > 8 else options.pop("signed", None)
        super().__init__(bits, method, signed=signed, **options)

    def precision_of(self, bits: int, signed: bool) -> Precision | WidePrecision:
        if bits > 8:
            if bits not in RESIDUAL_BITS:
                raise ValueError(f"residual bits must be one of {RESIDUAL_BITS}, got {bits}")
            return WidePrecision(bits)
        return activation_precision(bits, signed)


#: the quantizer of a residual-stream value (the same class)
ResidualQuantizer = ValueQuantizer


def _quantize_output(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """The forward hook of a module whose output is a quantized value."""
    return getattr(module, ATTR)(output)


def _quantize_input(module: nn.Module, inputs: tuple) -> tuple:
    """The forward pre-hook of a module whose first input is a quantized value."""
    return (getattr(module, INPUT_ATTR)(inputs[0]), *inputs[1:])


@dataclass(frozen=True)
class ResidualPoint:
    """A module whose output a residual add reads: `role` 'stream' (an add's result, after
    its ReLU) or 'shortcut' (an add's shortcut operand)."""

    module: str
    role: str


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (*QUANT_MODULES, ActQuantizer)) or super().is_leaf_module(m,
                                                                                      qualname)


def _trace(model: nn.Module, option: str = "residual_bits"
           ) -> tuple[fx.Graph, dict[str, int]]:
    """The fx graph of `model` and how often each module is called in one forward."""
    calls: dict[str, int] = {}
    handles = []
    for name, m in model.named_modules():
        def count(mod, args, name=name):
            calls[name] = calls.get(name, 0) + 1
        handles.append(m.register_forward_pre_hook(count))
    try:
        graph = _Tracer().trace(model)
    except Exception as e:
        raise ValueError(f"{option} needs a model torch.fx can trace ({type(e).__name__}: "
                         f"{e}); quantize without {option}") from None
    finally:
        for h in handles:
            h.remove()
    for n in graph.nodes:  # leaf modules are calls of their own, not traced through
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1
    return graph, calls


def _stack(n: fx.Node) -> list[str]:
    """Module paths whose forward computed `n`, outermost first (a leaf call adds itself)."""
    paths = [path for path, _ in (n.meta.get("nn_module_stack") or {}).values()]
    if n.op == "call_module" and (not paths or paths[-1] != n.target):
        paths.append(n.target)
    return paths


def _owner(n: fx.Node, calls: dict[str, int], modules: dict[str, nn.Module]) -> str | None:
    """The module whose output is `n` (read outside it or returned) on its one call: the
    innermost such module that the tracer traces through (so that the graph shows the hook),
    else the innermost (a leaf without parameters, e.g. a pool, is traced through by
    `lowbit.graph` when it holds a residual quantizer)."""
    readers = list(n.users)
    owners = [path for path in reversed(_stack(n)) if calls.get(path, 0) == 1
              and all(u.op == "output" or path not in _stack(u) for u in readers)]
    tracer = _Tracer()
    for path in owners:
        if not tracer.is_leaf_module(modules[path], path):
            return path
    for path in owners:
        if not any(True for _ in modules[path].parameters(recurse=False)):
            return path
    return None


def _conv_depth(graph: fx.Graph, modules: dict[str, nn.Module]) -> dict[fx.Node, int]:
    """Per node, the most conv / linear layers on any path from the input to it."""
    depth: dict[fx.Node, int] = {}
    for n in graph.nodes:
        d = max((depth.get(a, 0) for a in n.all_input_nodes), default=0)
        if n.op == "call_module" and isinstance(modules.get(n.target),
                                                (nn.Conv2d, nn.Linear, *QUANT_MODULES)):
            d += 1
        depth[n] = d
    return depth


def _is_relu(n: fx.Node, modules: dict[str, nn.Module]) -> bool:
    if n.op == "call_module":
        return isinstance(modules.get(n.target), nn.ReLU)
    return n.target in (torch.relu, torch.relu_, torch.nn.functional.relu) or n.target in (
        "relu", "relu_")


def residual_points(model: nn.Module) -> tuple[list[ResidualPoint], list[str]]:
    """(the modules whose outputs get a residual quantizer, in graph order; the adds left
    wide and why) of `model` (module docstring)."""
    graph, calls = _trace(model)
    modules = dict(model.named_modules())
    depth = _conv_depth(graph, modules)
    points: dict[str, ResidualPoint] = {}
    skipped: list[str] = []
    for n in graph.nodes:
        name = getattr(n.target, "__name__", n.target)
        if n.op not in ("call_function", "call_method") or name not in _ADDS:
            continue
        ops = [a for a in n.args if isinstance(a, fx.Node)]
        if len(ops) != 2 or ops[0] is ops[1] or n.kwargs.get("alpha", 1) != 1:
            continue
        users = list(n.users)
        value = users[0] if len(users) == 1 and _is_relu(users[0], modules) else n
        shortcut = min(ops, key=lambda a: (depth[a], list(graph.nodes).index(a)))
        for node, role in ((value, "stream"), (shortcut, "shortcut")):
            owner = _owner(node, calls, modules)
            if owner is None:
                if node.op != "placeholder":
                    skipped.append(f"{n.name}: its {role} {node.name} is no module's output on "
                                   "every call")
                continue
            if owner not in points:
                points[owner] = ResidualPoint(owner, role)
    return list(points.values()), skipped


#: activation functions computed as a table of their quantized input (`activation_points`)
TABLE_ACTIVATIONS = (nn.Hardswish, nn.SiLU, nn.Sigmoid, nn.Hardsigmoid, nn.GELU, nn.Tanh,
                     nn.Mish, nn.ELU, nn.LeakyReLU, nn.Softplus)
TABLE_FUNCTIONS = {F.hardswish, F.silu, torch.sigmoid, F.sigmoid, F.hardsigmoid, F.gelu,
                   torch.tanh, F.tanh, F.mish, F.elu, F.leaky_relu, F.softplus,
                   "sigmoid", "tanh"}
_PASS_THROUGH = (nn.BatchNorm1d, nn.BatchNorm2d, nn.Dropout, nn.Dropout2d, nn.Identity)
#: what a product's map operand may read its layer through besides `_PASS_THROUGH`: ReLU and
#: ReLU6 / Hardtanh (modules or functions)
_MAP_CLAMPS = (nn.ReLU, nn.Hardtanh)
_MAP_CLAMP_FUNCTIONS = {F.relu, F.relu_, torch.relu, torch.relu_, F.relu6, F.hardtanh, "relu",
                        "relu_"}
#: the targets of a product of two tensors
MUL_TARGETS = {operator.mul, operator.imul, torch.mul, "mul", "mul_", "__mul__", "__rmul__"}
#: activation input quantizer widths (one byte: a table of at most 256 entries)
ACTIVATION_BITS = (2, 3, 4, 5, 6, 7, 8)


def _is_map_clamp(n: object, modules: dict[str, nn.Module]) -> bool:
    """Whether fx node n is a ReLU / ReLU6 / Hardtanh (module or function) of a tensor."""
    if not isinstance(n, fx.Node) or not n.args:
        return False
    if n.op == "call_module":
        return isinstance(modules.get(n.target), _MAP_CLAMPS)
    return n.op in ("call_function", "call_method") and n.target in _MAP_CLAMP_FUNCTIONS


def _reads_quant_layer(n: object, modules: dict[str, nn.Module], clamps: bool = False
                       ) -> bool:
    """Whether fx node n is a fake-quant conv / linear's output, through BatchNorms and
    identities (and ReLU / ReLU6 / Hardtanh with `clamps`)."""
    while (isinstance(n, fx.Node) and n.op == "call_module" and
           isinstance(modules.get(n.target), _PASS_THROUGH)) or \
            (clamps and _is_map_clamp(n, modules)):
        n = n.args[0]
    return isinstance(n, fx.Node) and n.op == "call_module" and \
        isinstance(modules.get(n.target), QUANT_MODULES)


def _map_owner(x: fx.Node, calls: dict[str, int], modules: dict[str, nn.Module]
               ) -> str | None:
    """The module whose output quantizer makes a product's map x a quantized value: x's
    owner (`_owner`), else, where x is a clamp no module writes (a functional ReLU), the
    owner of the value it clamps (the clamp of a quantized value is a table too)."""
    while (owner := _owner(x, calls, modules)) is None and _is_map_clamp(x, modules):
        x = x.args[0]
    return owner


def _product_map(n: fx.Node, gates: set[fx.Node], modules: dict[str, nn.Module]
                 ) -> fx.Node | None:
    """The map operand of product n whose other operand is a gate (a table activation whose
    input is quantized), where the map is a quantized layer's output through BatchNorm and
    clamps (`_reads_quant_layer`), else None."""
    if n.op not in ("call_function", "call_method") or n.target not in MUL_TARGETS or \
            len(n.args) != 2 or n.kwargs:
        return None
    a, b = n.args
    for gate, other in ((a, b), (b, a)):
        if gate in gates and isinstance(other, fx.Node) and other not in gates and \
                _reads_quant_layer(other, modules, clamps=True):
            return other
    return None


def activation_points(model: nn.Module) -> tuple[list[tuple[str, str]], list[str]]:
    """([(module, 'input' / 'output')] whose quantizer makes an activation function's input
    a quantized value, in graph order; the activations left float and why) of `model`: every
    activation of `TABLE_ACTIVATIONS` (module: its input) or `TABLE_FUNCTIONS` (functional:
    the output of the module it reads) whose input is a fake-quant conv / linear's output
    (through BatchNorm); and the map operand of a product of such an activation with a
    quantized layer's output through BatchNorm and ReLU / ReLU6 (squeeze-excite, module
    docstring): the output of the module writing the map."""
    graph, calls = _trace(model, "activation_bits")
    modules = dict(model.named_modules())
    points: dict[tuple[str, str], None] = {}
    skipped: list[str] = []
    gates: set[fx.Node] = set()  # the activations whose input is quantized
    for n in graph.nodes:
        if (x := _product_map(n, gates, modules)) is not None:
            if (owner := _map_owner(x, calls, modules)) is None:
                skipped.append(f"{n.name}: its map operand {x.name} is no module's output on "
                               "every call")
            else:
                points[(owner, "output")] = None
            continue
        module = modules.get(n.target) if n.op == "call_module" else None
        functional = n.op in ("call_function", "call_method") and n.target in TABLE_FUNCTIONS
        if not (isinstance(module, TABLE_ACTIVATIONS) or functional) or not n.args or \
                not _reads_quant_layer(n.args[0], modules):
            continue
        if module is not None:
            if calls.get(n.target, 0) != 1:
                skipped.append(f"{n.target}: called {calls.get(n.target, 0)} times")
            else:
                points[(n.target, "input")] = None
                gates.add(n)
            continue
        owner = _owner(n.args[0], calls, modules)
        if owner is None:
            skipped.append(f"{n.name}: its input {n.args[0].name} is no module's output on "
                           "every call")
        else:
            points[(owner, "output")] = None
            gates.add(n)
    return list(points), skipped


def add_activation_quantizers(model: nn.Module, bits: int, make: object) -> list[str]:
    """Attach a quantizer of `bits` (`make(name, bits)` builds it) at every activation point
    of `model` (`activation_points`) that has none; returns the activations left float and
    why (the model cannot be traced: all of them)."""
    try:
        points, skipped = activation_points(model)
    except ValueError as e:
        if any(isinstance(m, TABLE_ACTIVATIONS) for m in model.modules()):
            return [f"activation inputs stay float: {e}"]
        return []
    for module, where in points:
        if quantizer_of(model.get_submodule(module), where) is None:
            attach(model, module, make(f"{module}.{ATTRS[where]}", bits), where)
    return skipped


def attach(model: nn.Module, module: str, quantizer: ValueQuantizer, where: str = "output"
           ) -> None:
    """Give `module` of `model` the quantizer of its output (a forward hook) or, where="input",
    of its first input (a forward pre-hook)."""
    if where not in ATTRS:
        raise ValueError(f"where must be one of {sorted(ATTRS)}, got {where!r}")
    owner = model.get_submodule(module) if module else model
    if isinstance(getattr(owner, ATTRS[where], None), ValueQuantizer):
        raise ValueError(f"{module or 'the model'} already has a quantizer of its {where}")
    setattr(owner, ATTRS[where], quantizer)
    if where == "output":
        owner.register_forward_hook(_quantize_output)
    else:
        owner.register_forward_pre_hook(_quantize_input)


def quantizer_of(m: nn.Module, where: str) -> ValueQuantizer | None:
    """The quantizer of module m's output / input, or None."""
    q = getattr(m, ATTRS[where], None)
    return q if isinstance(q, ValueQuantizer) else None


def residual_quantizers(model: nn.Module) -> dict[str, ValueQuantizer]:
    """{owner module name: the quantizer of its output} of a quantized model."""
    return {name: q for name, m in model.named_modules()
            if (q := quantizer_of(m, "output")) is not None}


def value_quantizers(model: nn.Module) -> dict[str, ValueQuantizer]:
    """{'owner.residual_quant' / 'owner.input_quant': quantizer} of every value quantizer of a
    quantized model (outputs and inputs)."""
    return {f"{name}.{attr}" if name else attr: q for name, m in model.named_modules()
            for where, attr in ATTRS.items() if (q := quantizer_of(m, where)) is not None}


def check_residual_bits(residual_bits: object, overrides: object = None
                        ) -> tuple[int | None, dict[str, int | None]]:
    """Validated (residual_bits, per-module overrides {name or glob: bits or None})."""
    def one(name: str, v: object) -> int | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v not in RESIDUAL_BITS:
            raise ValueError(f"{name} must be None or one of {RESIDUAL_BITS}, got {v!r}")
        return v

    bits = one("residual_bits", residual_bits)
    if overrides is None:
        return bits, {}
    if not isinstance(overrides, Mapping):
        raise TypeError(f"residual_layers must be a dict {{module name or glob: bits or None}}, "
                        f"got {type(overrides).__name__}")
    out = {}
    for k, v in overrides.items():
        if not isinstance(k, str):
            raise TypeError(f"residual_layers keys must be module names or globs, got {k!r}")
        out[k] = one(f"residual_layers[{k!r}]", v)
    return bits, out


def add_residual_quantizers(model: nn.Module, bits: int | None,
                            overrides: Mapping[str, int | None], make: object
                            ) -> dict[str, int]:
    """Attach a quantizer to every residual point of `model` whose bits (`bits`, or the last
    override whose pattern matches the module or one of its parents: a per-block override)
    are set; `make(name, bits)` builds it. Returns {module: bits}; ValueError when an
    override matches no residual point."""
    points, _ = residual_points(model)
    names = [p.module for p in points]
    for pattern in overrides:
        if not any(_matches(n, pattern) for n in names):
            raise ValueError(f"residual_layers[{pattern!r}] matches no module whose output a "
                             f"residual add reads; those modules: {', '.join(names) or 'none'}")
    chosen = {}
    for p in points:
        b = bits
        for pattern, v in overrides.items():
            if _matches(p.module, pattern):
                b = v
        if b is not None:
            attach(model, p.module, make(p.module, b))
            chosen[p.module] = b
    return chosen


def _matches(name: str, pattern: str) -> bool:
    """name is the pattern, inside it, or matches it as a glob."""
    return (name == pattern or name.startswith(pattern + ".")
            or fnmatch.fnmatchcase(name, pattern))


def residual_recipes(model: nn.Module) -> dict[str, dict]:
    """{owner module (an output quantizer) or 'owner.input_quant' (an input one): what
    rebuilds the quantizer} (the saved manifest's part; the observed state travels in the
    state_dict)."""
    out = {}
    for name, m in model.named_modules():
        for where in ATTRS:
            q = quantizer_of(m, where)
            if q is None:
                continue
            obs = q.observer
            key = name if where == "output" else f"{name}.{INPUT_ATTR}"
            out[key] = {"bits": q.bits, "method": q.method, "nonfinite": q.nonfinite,
                        "threshold": obs.threshold, "percentile": obs.percentile,
                        "observer": {"bins": obs.bins, "momentum": obs.momentum,
                                     "tau": obs.tau, "eta": obs.eta}, "where": where}
    return out


def attach_residual(model: nn.Module, recipes: Mapping[str, Mapping]) -> None:
    """Rebuild the value quantizers `residual_recipes` described on `model` (a fresh model
    of the same architecture); ValueError naming a module the model does not have."""
    for key, r in recipes.items():
        where = r.get("where", "output")
        name = key.removesuffix(f".{INPUT_ATTR}") if where == "input" else key
        try:
            model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"the model's architecture does not match the saved one: it has "
                             f"no module {name} (holding a quantizer of its {where})") from None
        q = ValueQuantizer(int(r["bits"]), r["method"], threshold=r["threshold"],
                           percentile=r["percentile"], nonfinite=r["nonfinite"],
                           layer_name=f"{name}.{ATTRS[where]}", **r["observer"])
        attach(model, name, q, where)

"""The value graph of a quantized model: torch.fx trace -> a DAG of the ops the engine knows.

`trace_model(model, example_input)` traces the model (fake-quant layers of `lowbit.quantize`
and converted IntegerConv2d / IntegerLinear are leaves), runs it once on the example input to
record every value's range (the wide realizations' scales) and shape, and turns the fx nodes
into `Value`s:

  input, layer (conv2d / linear with its IntegerLayer, BatchNorm folded, optional residual),
  relu, maxpool, avgpool (window / global / adaptive; `x.mean((2, 3))` too), flatten, concat
  (channels), quant (a value quantizer of the model, `lowbit.quant.residual`: a residual
  stream's or an activation's input, with its precision and scale; the modules holding one
  are traced through so that its hook shows), act (an elementwise activation: a clamp with
  constant bounds, ReLU6 / Hardtanh / `torch.clamp`, attrs lo / hi; or a function such as
  hardswish / SiLU / sigmoid / GELU, attrs module: its float computation), mul (the product
  of two tensors, one possibly broadcast over the map: squeeze-excite's channel scale),
  gather (channels selected by index: chunk / split / `x[:, a:b]`, a channel shuffle's
  view / transpose / view), affine (an eval BatchNorm that folds into no layer: attrs
  module), and float (anything else: a PyTorch module run in float, with the reason;
  `lowbit.graph.node_forms` recognizes the forms).

Rewrites, each checked: a BatchNorm that alone consumes a fake-quant layer folds into it
(`lowbit.quant.convert.integer_layer`), any other in eval mode is an affine value (a
per-channel requantization of its input: `lowbit.graph.affine`); a residual add fuses into
the layer among its operands that only the add reads (the later one); dropout and identities
vanish. What cannot be expressed exactly becomes a float value instead: never a silent
approximation.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ..core import Encoding, Precision
from ..quant.api import conv_unsupported_reason
from ..quant.convert import IntegerLayer, integer_layer
from ..quant.modules import QUANT_MODULES
from ..quant.residual import ResidualQuantizer, quantizer_of
from . import node_forms as forms
from .ir import PoolWindow
from .node_forms import describe
from .pools import ADAPTIVE, WINDOW

INPUT, LAYER, RELU, MAXPOOL, AVGPOOL, FLATTEN, CONCAT, FLOAT, QUANT = (
    "input", "layer", "relu", "maxpool", "avgpool", "flatten", "concat", "float", "quant")
ACT, MUL, GATHER, AFFINE = "act", "mul", "gather", "affine"
_ADD, _BN = "add", "batchnorm"  # transient ops: fused away or turned into float values


@dataclass(eq=False)
class Value:
    """One tensor value of the model. inputs: the values it reads (a layer: its input, then its
    residual). fx_name: the fx node computing it in float (its recorded range). attrs: op
    parameters (layer: module, bn, spec, residual, source, negated; pools: window; float:
    module, op, reason)."""

    name: str
    op: str
    inputs: list[Value]
    fx_name: str
    attrs: dict = field(default_factory=dict)
    index: int = 0

    @property
    def residual(self) -> Value | None:
        return self.attrs.get("residual")

    def __repr__(self) -> str:
        return f"Value({self.name}, {self.op})"


@dataclass(frozen=True)
class Stat:
    """A value's example shape (model order) and range."""

    shape: tuple[int, ...]
    lo: float
    hi: float

    @property
    def absmax(self) -> float:
        return max(abs(self.lo), abs(self.hi))


@dataclass(eq=False)
class Dataflow:
    """Values in topological order, the input and output values, example statistics."""

    values: list[Value]
    input: Value
    output: Value
    stats: dict[str, Stat]
    example_shape: tuple[int, ...]

    def users(self) -> dict[int, list[Value]]:
        """id(value) -> the values reading it (the output counts as a reader of itself)."""
        out: dict[int, list[Value]] = {id(v): [] for v in self.values}
        for v in self.values:
            for i in v.inputs:
                out[id(i)].append(v)
        out[id(self.output)].append(self.output)
        return out


def is_integer_module(m: nn.Module) -> bool:
    """A converted integer layer (IntegerConv2d / IntegerLinear: an IntegerLayer `spec`)."""
    return isinstance(getattr(m, "spec", None), IntegerLayer)


def is_quant_layer(m: nn.Module) -> bool:
    return isinstance(m, QUANT_MODULES) or is_integer_module(m)


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if is_quant_layer(m) or isinstance(m, ResidualQuantizer):
            return True
        if quantizer_of(m, "output") is not None or quantizer_of(m, "input") is not None:
            return False  # its hooks (the value quantizers) must be in the graph
        return super().is_leaf_module(m, qualname)


class _Recorder(fx.Interpreter):
    """Runs the traced model, keeping each tensor's shape and range and every other value."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.stats: dict[str, Stat] = {}
        self.others: dict[str, object] = {}

    def run_node(self, n: fx.Node) -> object:
        out = super().run_node(n)
        if isinstance(out, torch.Tensor) and out.dtype.is_floating_point and out.numel():
            self.stats[n.name] = Stat(tuple(out.shape), float(out.min()), float(out.max()))
        else:
            self.others[n.name] = out
        return out


_ADD_TARGETS = {operator.add, operator.iadd, torch.add, "add", "add_", "__add__", "__iadd__"}
_RELU_TARGETS = {F.relu, torch.relu, torch.relu_, F.relu_, "relu", "relu_"}
_IDENTITY_TARGETS = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
                     "contiguous", "clone"}
_CAT_TARGETS = {torch.cat, torch.concat, torch.concatenate}
_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Identity)


def _pair(v: object, name: str) -> int:
    """An int (or a pair of equal ints) -> the int; ValueError otherwise."""
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            v = v[0]
        elif len(v) == 2 and v[0] == v[1]:
            v = v[0]
        else:
            raise ValueError(f"{name}={tuple(v)} (not square)")
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name}={v!r}")
    return v


def _max_window(kw: dict) -> PoolWindow:
    k = _pair(kw["kernel_size"], "kernel_size")
    stride = kw.get("stride")
    s = k if stride in (None, [], ()) else _pair(stride, "stride")
    p = _pair(kw.get("padding", 0), "padding")
    if _pair(kw.get("dilation", 1), "dilation") != 1:
        raise ValueError(f"dilation={kw.get('dilation')}")
    if kw.get("return_indices"):
        raise ValueError("return_indices")
    return PoolWindow(k, s, p, bool(kw.get("ceil_mode", False)))


def _avg_window(kw: dict) -> dict:
    if kw.get("ceil_mode"):
        raise ValueError("ceil_mode (an average pool's last windows)")
    w = _max_window({**kw, "dilation": 1, "return_indices": False})
    if kw.get("divisor_override") is not None:
        raise ValueError(f"divisor_override={kw['divisor_override']}")
    if w.pad and not kw.get("count_include_pad", True):
        raise ValueError("count_include_pad=False with padding")
    return {"mode": WINDOW, "kernel": w.kernel, "stride": w.stride, "pad": w.pad}


def _adaptive(output_size: object) -> dict:
    size = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * 2
    if len(size) != 2:
        raise ValueError(f"output_size={output_size!r}")
    return {"mode": ADAPTIVE, "output_size": tuple(size)}


class _Converter:
    """fx graph -> Values (the module docstring's rewrites happen in `trace_model`)."""

    def __init__(self, gm: fx.GraphModule, rec: _Recorder) -> None:
        self.gm, self.rec = gm, rec
        self.modules = dict(gm.named_modules())
        self.env: dict[str, Value] = {}
        self.values: list[Value] = []
        #: per value of a [N, A, B, H, W] view of a map's channels: (the map, the view)
        self.views: dict[int, tuple[Value, forms.ChannelView]] = {}

    def value(self, a: object) -> Value | None:
        return self.env.get(a.name) if isinstance(a, fx.Node) else None

    def add(self, node: fx.Node, value_op: str, inputs: list[Value], **attrs: object) -> Value:
        v = Value(node.name, value_op, inputs, node.name, dict(attrs), len(self.values))
        self.values.append(v)
        self.env[node.name] = v
        return v

    def alias(self, node: fx.Node, v: Value) -> Value:
        self.env[node.name] = v
        return v

    def fallback(self, node: fx.Node, reason: str) -> Value:
        """`node` as a float value: a GraphModule holding it and the non-tensor nodes it
        depends on, its tensor inputs as placeholders."""
        module, inputs = self.node_module(node)
        return self.add(node, FLOAT, inputs, module=module, op=describe(node, self.modules),
                        reason=reason)

    def node_module(self, node: fx.Node) -> tuple[fx.GraphModule, list[Value]]:
        """(a GraphModule computing `node` from its tensor inputs, those inputs' values)."""
        graph = fx.Graph()
        inputs: list[Value] = []
        copied: dict[str, fx.Node] = {}

        def copy(n: fx.Node) -> fx.Node:
            if n.name in copied:
                return copied[n.name]
            v = self.env.get(n.name)
            if v is not None:
                inputs.append(v)
                new = graph.placeholder(f"in{len(inputs) - 1}")
            else:
                new = graph.node_copy(n, copy)
            copied[n.name] = new
            return new

        graph.output(graph.node_copy(node, copy))
        return fx.GraphModule(self.gm, graph), inputs

    def convert(self, node: fx.Node) -> Value:
        tensor_args = [self.value(a) for a in node.all_input_nodes]
        if any(a is None for a in tensor_args) and node.op != "call_method":
            missing = [a.name for a, v in zip(node.all_input_nodes, tensor_args, strict=True)
                       if v is None and a.name in self.rec.stats]
            if missing:
                return self.fallback(node, f"reads tensor constants {missing}")
        if node.op == "call_module":
            return self.module(node)
        return self.function(node)

    def module(self, node: fx.Node) -> Value:
        m = self.modules[node.target]
        x = self.value(node.args[0]) if node.args else None
        if len(node.args) != 1 or node.kwargs or x is None:
            return self.fallback(node, "called with other arguments than one tensor")
        if is_quant_layer(m):
            return self.layer(node, m, x)
        if isinstance(m, ResidualQuantizer):
            if x.op == QUANT and x.attrs["module"] is m:  # traced twice (a Sequential's
                return self.alias(node, x)                # hook): quantizing is idempotent
            return self.add(node, QUANT, [x], module=m, precision=m.precision(),
                            scale=float(m.scale()), target=str(node.target))
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            return self.add(node, _BN, [x], module=m, target=str(node.target))
        if isinstance(m, nn.ReLU):
            return self.add(node, RELU, [x])
        if (bounds := forms.clamp_bounds(node, m)) is not None:
            return self.add(node, ACT, [x], kind="clamp", lo=bounds[0], hi=bounds[1],
                            module=m, op=describe(node, self.modules))
        if forms.is_table_activation(node, m):
            return self.add(node, ACT, [x], kind="fn", module=m,
                            op=describe(node, self.modules))
        if isinstance(m, _DROPOUTS):
            return self.alias(node, x)
        try:
            if isinstance(m, nn.MaxPool2d):
                w = _max_window({"kernel_size": m.kernel_size, "stride": m.stride,
                                 "padding": m.padding, "dilation": m.dilation,
                                 "ceil_mode": m.ceil_mode, "return_indices": m.return_indices})
                return self.add(node, MAXPOOL, [x], window=w)
            if isinstance(m, nn.AvgPool2d):
                return self.add(node, AVGPOOL, [x], **_avg_window(
                    {"kernel_size": m.kernel_size, "stride": m.stride, "padding": m.padding,
                     "ceil_mode": m.ceil_mode, "count_include_pad": m.count_include_pad,
                     "divisor_override": m.divisor_override}))
            if isinstance(m, nn.AdaptiveAvgPool2d):
                return self.add(node, AVGPOOL, [x], **_adaptive(m.output_size))
        except ValueError as e:
            return self.fallback(node, f"{type(m).__name__} with {e}: no integer pool")
        if isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1:
            return self.add(node, FLATTEN, [x])
        if isinstance(m, nn.Conv2d):
            why = conv_unsupported_reason(m)
            return self.fallback(node, f"float Conv2d ({why}: no integer conv)" if why else
                                 "float Conv2d (not quantized by lowbit.quantize)")
        if isinstance(m, nn.Linear):
            return self.fallback(node, "float Linear (not quantized by lowbit.quantize)")
        return self.fallback(node, f"{type(m).__name__} has no integer form")

    def layer(self, node: fx.Node, m: nn.Module, x: Value) -> Value:
        spec_kind = m.spec.kind if is_integer_module(m) else (
            "conv2d" if isinstance(m, nn.Conv2d) else "linear")
        shape = self.rec.stats[x.fx_name].shape
        if spec_kind == "linear" and len(shape) != 2:
            return self.fallback(node, f"linear layer on a {len(shape)}-d input (the engine's "
                                       "GEMM reads [N, C])")
        return self.add(node, LAYER, [x], module=m, bn=None, residual=None,
                        source=(str(node.target),), kind=spec_kind)

    def function(self, node: fx.Node) -> Value:
        t = node.target
        args = [self.value(a) for a in node.args if isinstance(a, fx.Node)]
        first = self.value(node.args[0]) if node.args else None
        if t in _ADD_TARGETS and len(node.args) == 2 and node.kwargs.get("alpha", 1) == 1:
            a, b = (self.value(v) for v in node.args)
            if a is not None and b is not None:
                return self.add(node, _ADD, [a, b])
            return self.fallback(node, "add of a tensor and a constant")
        if t in _RELU_TARGETS and first is not None and len(args) == 1:
            return self.add(node, RELU, [first])
        if t in _IDENTITY_TARGETS and first is not None and len(args) == 1:
            return self.alias(node, first)
        if first is not None and len(args) == 1 and (v := self.elementwise(node, first)):
            return v
        if v := self.channels(node, first):
            return v
        if forms.is_mul(node) and len(args) == 2:
            return self.add(node, MUL, args, module=_MulModule(), op="mul")
        if t in (torch.flatten, "flatten") and first is not None:
            start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
            end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
            if start == 1 and end == -1:
                return self.add(node, FLATTEN, [first])
        if t in ("view", "reshape") and first is not None and self.batch_flatten(node):
            return self.add(node, FLATTEN, [first])
        if t in _CAT_TARGETS and isinstance(node.args[0], (list, tuple)):
            parts = [self.value(a) for a in node.args[0]]
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            if all(p is not None for p in parts) and dim == 1:
                return self.add(node, CONCAT, parts)
            return self.fallback(node, f"concatenation along dim {dim} (channels: dim 1)")
        name = getattr(t, "__name__", "")
        if node.op == "call_function" and name in ("max_pool2d", "avg_pool2d",
                                                   "adaptive_avg_pool2d"):
            kw = node.normalized_arguments(self.gm, normalize_to_only_use_kwargs=True).kwargs
            x = self.value(kw["input"])
            try:
                if name == "max_pool2d":
                    return self.add(node, MAXPOOL, [x], window=_max_window(kw))
                if name == "avg_pool2d":
                    return self.add(node, AVGPOOL, [x], **_avg_window(kw))
                return self.add(node, AVGPOOL, [x], **_adaptive(kw["output_size"]))
            except ValueError as e:
                return self.fallback(node, f"{name} with {e}: no integer pool")
        return self.fallback(node, f"{describe(node, self.modules)} has no integer form")

    def elementwise(self, node: fx.Node, x: Value) -> Value | None:
        """Clamps, table activations, spatial means, eval-mode stochastic depth."""
        if forms.is_eval_stochastic_depth(node):
            return self.alias(node, x)
        if (bounds := forms.clamp_bounds(node)) is not None:
            module, _ = self.node_module(node)
            return self.add(node, ACT, [x], kind="clamp", lo=bounds[0], hi=bounds[1],
                            module=module, op=describe(node, self.modules))
        if forms.is_table_activation(node):
            module, _ = self.node_module(node)
            return self.add(node, ACT, [x], kind="fn", module=module,
                            op=describe(node, self.modules))
        stat = self.rec.stats.get(x.fx_name)
        keep = forms.mean_keepdim(node, stat.shape) if stat else None
        if keep is None:
            return None
        out, pooled = self.rec.stats[node.name], f"{node.name}.pooled"  # [N, C, 1, 1]
        self.rec.stats[pooled] = Stat((*stat.shape[:2], 1, 1), out.lo, out.hi)
        v = Value(node.name if keep else pooled, AVGPOOL, [x], node.name if keep else pooled,
                  _adaptive(1), len(self.values))
        self.values.append(v)
        if not keep:
            v = Value(node.name, FLATTEN, [v], node.name, {}, len(self.values))
            self.values.append(v)
        self.env[node.name] = v
        return v

    def channels(self, node: fx.Node, x: Value | None) -> Value | None:
        """Channel selections (chunk / split / slicing) and channel shuffles."""
        shape = self.rec.stats[node.name].shape if node.name in self.rec.stats else ()
        src = node.args[0] if node.args else None
        if node.target is operator.getitem and isinstance(src, fx.Node) and \
                src.name in self.rec.others and isinstance(node.args[1], int):
            parts = forms.split_parts(src, self.rec.others[src.name])
            first = self.value(src.args[0]) if src.args else None
            if parts is not None and first is not None:
                start = sum(parts[:node.args[1]])
                return self.add(node, GATHER, [first], index=tuple(
                    range(start, start + parts[node.args[1]])))
        if x is None:
            return None
        in_shape = self.rec.stats[x.fx_name].shape if x.fx_name in self.rec.stats else ()
        if len(in_shape) == 4 and (keep := forms.slice_channels(node, in_shape[1])):
            return self.add(node, GATHER, [x], index=tuple(keep))
        if (view := forms.channel_view(node, in_shape, shape)) is not None:
            v = self.fallback(node, "a view of a map's channels")
            self.views[id(v)] = (x, view)
            return v
        if id(x) in self.views:
            src_map, view = self.views[id(x)]
            if (moved := forms.transpose_view(node, view)) is not None:
                v = self.fallback(node, "a transpose of a view of a map's channels")
                self.views[id(v)] = (src_map, moved)
                return v
            if forms.closes_view(node, shape, view):
                return self.add(node, GATHER, [src_map],
                                index=tuple(int(i) for i in view.index.flatten()))
        return None

    def batch_flatten(self, node: fx.Node) -> bool:
        """x.view(x.size(0), -1) / x.reshape(x.shape[0], -1): a flatten from dim 1."""
        if len(node.args) != 3 or node.args[2] != -1 or node.kwargs:
            return False
        n = node.args[1]
        if not isinstance(n, fx.Node):
            return False
        if n.op == "call_method" and n.target == "size" and tuple(n.args[1:]) == (0,):
            return True
        return ((n.op == "call_function" and n.target is operator.getitem and n.args[1] == 0
                and isinstance(n.args[0], fx.Node) and n.args[0].target in ("shape", "size"))
                or (n.op == "call_function" and n.target is operator.getitem and n.args[1] == 0
                and isinstance(n.args[0], fx.Node) and n.args[0].op == "call_function"
                and n.args[0].target is getattr and n.args[0].args[1] == "shape"))


# ------------------------------------------------------------------------------ rewrites
def _replace(df_values: list[Value], old: Value, new: Value) -> None:
    for v in df_values:
        v.inputs = [new if i is old else i for i in v.inputs]
        if v.attrs.get("residual") is old:
            v.attrs["residual"] = new


def _float_layer(v: Value, reason: str) -> None:
    """Turn a layer value into a float value (its modules run in PyTorch)."""
    m, bn = v.attrs["module"], v.attrs["bn"]
    module = nn.Sequential(m, bn) if bn is not None else m
    v.op = FLOAT
    v.attrs = {"module": module, "op": f"{', '.join(v.attrs['source'])}: "
               f"{type(m).__name__}", "reason": reason}


def _fold_batchnorms(df: Dataflow) -> None:
    users = df.users()
    for v in list(df.values):
        if v.op != _BN:
            continue
        x = v.inputs[0]
        if (x.op == LAYER and x.attrs["bn"] is None and isinstance(x.attrs["module"],
                                                                   QUANT_MODULES)
                and users[id(x)] == [v] and v.attrs["module"].track_running_stats):
            x.attrs["bn"] = v.attrs["module"]
            x.attrs["source"] += (v.attrs["target"],)
            x.fx_name = v.fx_name
            _replace(df.values, v, x)
            if df.output is v:
                df.output = x
            df.values.remove(v)
        else:  # an eval affine (`graph.affine`: integer), or float (batch statistics)
            affine = forms.batchnorm_affine(v.attrs["module"]) is not None and \
                len(df.stats[v.fx_name].shape) in (2, 4)  # channels: dim 1 of NC / NCHW
            v.op = AFFINE if affine else FLOAT
            v.attrs.update(op=f"{v.attrs['target']}: {type(v.attrs['module']).__name__}",
                           reason="BatchNorm not directly after a fake-quant conv/linear "
                                  "whose only reader it is: nothing to fold it into" if
                           not affine else "a BatchNorm read in float")


def prepare_layer(v: Value) -> str | None:
    """Set v.attrs['spec'] (BN folded; channels with a negative folded scale negated, the
    weight precision widened by one bit where a negated weight needs it); returns why the
    layer cannot be an integer step, or None."""
    m = v.attrs["module"]
    spec = m.spec if is_integer_module(m) else integer_layer(m, v.attrs["bn"])
    scale = spec.out_scale
    if not bool(torch.isfinite(scale).all()) or bool((scale == 0).any()):
        return "folded BatchNorm scale is 0 (or not finite) in some channels"
    neg = scale < 0
    v.attrs["negated"] = int(neg.sum())
    if neg.any():
        flip = torch.where(neg, -1, 1).to(torch.int64).view(-1, *([1] * (spec.weight.dim() - 1)))
        weight = spec.weight.to(torch.int64) * flip
        w = spec.w
        if int(weight.max()) > w.qmax:
            if w.bits == 8:
                return ("negative folded BatchNorm scales: negated 8-bit weights need 9 bits")
            w = Precision(w.bits + 1, Encoding.SIGNED)
        spec = dataclasses.replace(spec, weight=weight.to(torch.int8), w=w,
                                   out_scale=scale.abs())
    v.attrs["spec"] = spec
    return None


def _fuse_adds(df: Dataflow) -> None:
    users = df.users()
    for v in list(df.values):
        if v.op != _ADD:
            continue
        a, b = v.inputs
        shape = df.stats[v.fx_name].shape
        candidates = [x for x in (a, b) if x.op == LAYER and x.residual is None
                      and users[id(x)] == [v] and df.stats[x.fx_name].shape == shape]
        if a is b or not candidates:
            v.op = FLOAT
            v.attrs.update(op="add", module=_AddModule(), reason=(
                "add whose operands are no conv/linear output read only by this add"))
            continue
        layer = max(candidates, key=lambda x: x.index)
        other = b if layer is a else a
        if df.stats[other.fx_name].shape != shape:
            v.op = FLOAT
            v.attrs.update(op="add", module=_AddModule(), reason="broadcasting add")
            continue
        layer.attrs["residual"] = other
        layer.attrs["source"] += (v.name,)
        layer.inputs = [layer.inputs[0], other]
        layer.fx_name = v.fx_name
        layer.index = v.index  # it runs where the add did: after both operands exist
        _replace(df.values, v, layer)
        if df.output is v:
            df.output = layer
        df.values.remove(v)
    df.values.sort(key=lambda x: x.index)


class _AddModule(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class _MulModule(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b


def _prune(df: Dataflow) -> None:
    """Keep the values the output depends on, in order, and renumber them."""
    keep: set[int] = set()
    stack = [df.output]
    while stack:
        v = stack.pop()
        if id(v) not in keep:
            keep.add(id(v))
            stack.extend(v.inputs)
    df.values = [v for v in df.values if id(v) in keep]
    for i, v in enumerate(df.values):
        v.index = i


def trace_model(model: nn.Module, example_input: torch.Tensor) -> Dataflow:
    """The value graph of `model` (eval mode) on `example_input` (module docstring)."""
    try:
        graph = _Tracer().trace(model)
    except Exception as e:
        raise ValueError(f"model cannot be traced by torch.fx ({type(e).__name__}: {e}); "
                         "lowbit.compile needs a traceable forward") from None
    gm = fx.GraphModule(model, graph)
    rec = _Recorder(gm)
    with torch.no_grad():
        rec.run(example_input)
    conv = _Converter(gm, rec)
    inp = out = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if inp is not None:
                raise ValueError("model must take one tensor input (forward(x))")
            inp = conv.add(node, INPUT, [])
        elif node.op == "output":
            out = conv.value(node.args[0])
            if out is None:
                raise ValueError("model must return one tensor")
        elif node.name in rec.stats and node.op != "get_attr":
            conv.convert(node)
    df = Dataflow(conv.values, inp, out, rec.stats, tuple(example_input.shape))
    _fold_batchnorms(df)
    for v in df.values:
        if v.op == LAYER and (why := prepare_layer(v)):
            _float_layer(v, why)
    _fuse_adds(df)
    _prune(df)
    return df

"""To ONNX Q/DQ: `to_onnx(model, example_input, path)` writes a lowbit fake-quant model (from
`lowbit.quantize`, trained or calibrated, or from `lowbit.from_onnx`) as a QCDQ ONNX model,
the form Brevitas's `export_onnx_qcdq` writes and `lowbit.from_onnx` reads:

- each QuantConv2d / QuantLinear: its input activation through QuantizeLinear -> Clip ->
  DequantizeLinear (scale `act_quant.scale()`, zero point 0 of type uint8 for an unsigned
  tensor, int8 for a signed one; the Clip holds the b-bit range and is left out at 8 bits),
  its integer weights (`weight_quant.integer`, exactly the ones `lowbit.convert` takes) as an
  int8 constant -> Clip -> DequantizeLinear (per-output-channel scales, axis 0), then Conv or
  Gemm (transB = 1) with the float bias. Binary (1-bit, -1/+1) weights are written as int8
  +-1 with Clip [-1, 1] and named in the model's metadata (`BINARY_WEIGHTS_KEY`) so that
  `from_onnx` reads them back as binary; binary activations (sign(x) * s) have no Q/DQ form
  (ValueError).
- a `StandaloneQuant` (an imported Q/DQ read by other ops) as Q/Clip/DQ on its input;
- BatchNorm (inference), ReLU, max / average / global average pools, flatten (also
  x.view(x.size(0), -1)), residual adds and other arithmetic, concat, clamp, softmax, float
  Conv2d / Linear; dropout and identities vanish. Anything else: ValueError naming the node.

Opset 13; the batch dimension is symbolic ("batch"). The model is traced with torch.fx (as
`lowbit.compile` does) and run once on `example_input` for the shapes. `from_onnx(to_onnx(m))`
holds the same integers, scales and bit widths as m and gives the same predictions.
"""

from __future__ import annotations

import json
import operator
import os
from pathlib import Path

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from ..core import Encoding, Precision
from .convert import IntegerLayer
from .modules import QUANT_MODULES, ActQuantizer
from .qdq_modules import BINARY_WEIGHTS_KEY, StandaloneQuant, require_onnx

OPSET = 13
_ARITH = {operator.add: "Add", operator.iadd: "Add", torch.add: "Add", operator.sub: "Sub",
          torch.sub: "Sub", operator.mul: "Mul", torch.mul: "Mul", operator.truediv: "Div",
          torch.div: "Div", "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}
_RELU = {F.relu, torch.relu, "relu"}
_ALIAS = {F.dropout, F.dropout2d, "contiguous", "clone"}
_SOFTMAX = {torch.softmax: "Softmax", F.softmax: "Softmax", torch.log_softmax: "LogSoftmax",
            F.log_softmax: "LogSoftmax", "softmax": "Softmax", "log_softmax": "LogSoftmax"}
_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Identity)


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (*QUANT_MODULES, ActQuantizer, StandaloneQuant)) or \
            isinstance(getattr(m, "spec", None), IntegerLayer) or \
            super().is_leaf_module(m, qualname)


def _pair(v: object) -> list[int]:
    return list(v) if isinstance(v, (tuple, list)) else [int(v), int(v)]


class _Writer:
    """fx graph (shapes propagated) -> ONNX nodes and initializers."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.onnx = require_onnx()
        self.gm = gm
        self.modules = dict(gm.named_modules())
        self.nodes: list = []
        self.inits: list = []
        self.tensors: dict[str, str] = {}
        self.binary: list[str] = []
        self.used: set[str] = set()

    # ------------------------------------------------------------------ helpers
    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def init(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.inits.append(self.onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def emit(self, op: str, inputs: list[str], base: str, **attrs: object) -> str:
        out = self.fresh(base)
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def tensor(self, arg: object, node: fx.Node) -> str:
        if isinstance(arg, fx.Node) and arg.name in self.tensors:
            return self.tensors[arg.name]
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return self.init(f"{node.name}.const", np.array(arg, dtype=np.float32))
        raise ValueError(f"node {node.name!r} ({_describe(node, self.modules)}): argument "
                         f"{arg!r} is not a tensor of the model")

    def act_qdq(self, x: str, prec: Precision, scale: float, base: str) -> str:
        """x -> QuantizeLinear -> Clip (below 8 bits) -> DequantizeLinear."""
        if prec.encoding is Encoding.BINARY:
            raise ValueError(f"layer {base!r}: binary activations (sign(x) * scale) have no "
                             "ONNX Q/DQ form; quantize the layer's input at 2 or more bits")
        dtype = np.uint8 if prec.encoding is Encoding.UNSIGNED else np.int8
        s = self.init(f"{base}.act_scale", np.array(scale, dtype=np.float32))
        zp = self.init(f"{base}.act_zero_point", np.array(0, dtype=dtype))
        q = self.emit("QuantizeLinear", [x, s, zp], f"{base}.act_quant")
        if prec.bits < 8:
            lo = self.init(f"{base}.act_min", np.array(prec.qmin, dtype=dtype))
            hi = self.init(f"{base}.act_max", np.array(prec.qmax, dtype=dtype))
            q = self.emit("Clip", [q, lo, hi], f"{base}.act_clip")
        return self.emit("DequantizeLinear", [q, s, zp], f"{base}.act_dequant")

    def weight_qdq(self, layer: nn.Module, base: str) -> str:
        """The layer's integer weights -> Clip (below 8 bits) -> DequantizeLinear (axis 0)."""
        q, scale = layer.weight_quant.integer(layer.weight)
        prec = layer.weight_quant.prec
        q = q.cpu().numpy().astype(np.int8)
        k = q.shape[0]
        w = self.init(f"{base}.weight_int", q)
        s = self.init(f"{base}.weight_scale", scale.cpu().numpy().astype(np.float32))
        zp = self.init(f"{base}.weight_zero_point", np.zeros(k, dtype=np.int8))
        if prec.bits < 8:
            lo, hi = (-1, 1) if prec.encoding is Encoding.BINARY else (prec.qmin, prec.qmax)
            w = self.emit("Clip", [w, self.init(f"{base}.weight_min", np.array(lo, np.int8)),
                                   self.init(f"{base}.weight_max", np.array(hi, np.int8))],
                          f"{base}.weight_clip")
        out = self.emit("DequantizeLinear", [w, s, zp], f"{base}.weight", axis=0)
        if prec.encoding is Encoding.BINARY:
            self.binary.append(out)
        return out

    def layer(self, x: str, m: nn.Module, weight: str, base: str) -> str:
        bias = [] if m.bias is None else [
            self.init(f"{base}.bias", m.bias.detach().float().cpu().numpy())]
        if isinstance(m, nn.Linear):
            return self.emit("Gemm", [x, weight, *bias], base, transB=1)
        if isinstance(m.padding, str) or m.padding_mode != "zeros":
            raise ValueError(f"{base}: padding={m.padding!r}, padding_mode={m.padding_mode!r} "
                             "(explicit zero padding only)")
        ph, pw = _pair(m.padding)
        return self.emit("Conv", [x, weight, *bias], base, kernel_shape=_pair(m.kernel_size),
                         strides=_pair(m.stride), pads=[ph, pw, ph, pw],
                         dilations=_pair(m.dilation), group=m.groups)

    # ------------------------------------------------------------------ nodes
    def write(self, node: fx.Node) -> None:
        if node.op == "get_attr":
            value = _fetch(self.gm, node.target)
            if isinstance(value, torch.Tensor):
                self.tensors[node.name] = self.init(
                    node.target, value.detach().float().cpu().numpy())
            return
        meta = node.meta.get("tensor_meta")
        if meta is None or not hasattr(meta, "shape"):
            return  # sizes and other non-tensor values: read by the ops that use them
        if node.op == "call_module":
            out = self.module(node, self.modules[node.target])
        else:
            out = self.function(node)
        self.tensors[node.name] = out

    def module(self, node: fx.Node, m: nn.Module) -> str:
        base = node.target
        x = self.tensor(node.args[0], node)
        if isinstance(getattr(m, "spec", None), IntegerLayer):
            raise ValueError(f"{base}: a converted integer layer; to_onnx writes the "
                             "fake-quant model (before lowbit.convert)")
        if isinstance(m, QUANT_MODULES):
            aq = m.act_quant
            x = self.act_qdq(x, aq.precision(), aq.scale(), base)
            return self.layer(x, m, self.weight_qdq(m, base), base)
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            w = self.init(f"{base}.weight", m.weight.detach().float().cpu().numpy())
            return self.layer(x, m, w, base)
        if isinstance(m, StandaloneQuant):
            return self.act_qdq(x, m.prec, m.scale, base)
        if isinstance(m, ActQuantizer):
            return self.act_qdq(x, m.precision(), m.scale(), base)
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            return self.batchnorm(x, m, base)
        if isinstance(m, nn.ReLU):
            return self.emit("Relu", [x], base)
        if isinstance(m, _DROPOUTS):
            return x
        if isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1:
            return self.emit("Flatten", [x], base, axis=1)
        if isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
            return self.pool(x, m.__dict__, "MaxPool" if isinstance(m, nn.MaxPool2d)
                             else "AveragePool", base)
        if isinstance(m, nn.AdaptiveAvgPool2d):
            return self.adaptive(x, node, m.output_size, base)
        if isinstance(m, nn.Softmax):
            return self.emit("Softmax", [x], base, axis=-1 if m.dim is None else m.dim)
        raise ValueError(f"{base}: {type(m).__name__} has no ONNX form in lowbit.to_onnx")

    def batchnorm(self, x: str, bn: nn.Module, base: str) -> str:
        if not bn.track_running_stats or bn.running_mean is None:
            raise ValueError(f"{base}: BatchNorm without running statistics")
        k = bn.num_features
        gamma = bn.weight if bn.affine else torch.ones(k)
        beta = bn.bias if bn.affine else torch.zeros(k)
        params = [self.init(f"{base}.{n}", t.detach().float().cpu().numpy()) for n, t in
                  (("weight", gamma), ("bias", beta), ("running_mean", bn.running_mean),
                   ("running_var", bn.running_var))]
        return self.emit("BatchNormalization", [x, *params], base, epsilon=float(bn.eps))

    def pool(self, x: str, kw: dict, op: str, base: str) -> str:
        k = _pair(kw["kernel_size"])
        stride = kw.get("stride")
        s = k if stride in (None, [], ()) else _pair(stride)
        p = _pair(kw.get("padding", 0))
        attrs = {"kernel_shape": k, "strides": s, "pads": [*p, *p],
                 "ceil_mode": int(bool(kw.get("ceil_mode", False)))}
        if op == "MaxPool":
            if _pair(kw.get("dilation", 1)) != [1, 1] or kw.get("return_indices"):
                raise ValueError(f"{base}: max-pool with dilation or indices")
        else:
            if kw.get("divisor_override") is not None:
                raise ValueError(f"{base}: avg-pool with divisor_override")
            attrs["count_include_pad"] = int(bool(kw.get("count_include_pad", True)))
        return self.emit(op, [x], base, **attrs)

    def adaptive(self, x: str, node: fx.Node, size: object, base: str) -> str:
        size = _pair(size)
        src = node.args[0] if node.args else node.kwargs.get("input")
        if size == [1, 1]:
            return self.emit("GlobalAveragePool", [x], base)
        if list(src.meta["tensor_meta"].shape[2:]) == size:
            return x
        raise ValueError(f"{base}: adaptive average pool to {size} (only 1x1)")

    def function(self, node: fx.Node) -> str:
        t, args, base = node.target, node.args, node.name
        if t in _ARITH and len(args) == 2 and node.kwargs.get("alpha", 1) == 1:
            return self.emit(_ARITH[t], [self.tensor(a, node) for a in args], base)
        x = self.tensor(args[0], node) if args and not isinstance(args[0], (list, tuple)) \
            else None
        if t in _RELU:
            return self.emit("Relu", [x], base)
        if t in _ALIAS:
            return x
        if t in (torch.flatten, "flatten"):
            start = args[1] if len(args) > 1 else node.kwargs.get("start_dim", 0)
            end = args[2] if len(args) > 2 else node.kwargs.get("end_dim", -1)
            if (start, end) == (1, -1):
                return self.emit("Flatten", [x], base, axis=1)
        if t in ("view", "reshape", torch.reshape) and self.batch_flatten(node):
            return self.emit("Flatten", [x], base, axis=1)
        if t in (torch.cat, torch.concat):
            dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
            return self.emit("Concat", [self.tensor(a, node) for a in args[0]], base, axis=dim)
        if t is torch.clamp:
            lo = args[1] if len(args) > 1 else node.kwargs.get("min")
            hi = args[2] if len(args) > 2 else node.kwargs.get("max")
            bounds = ["" if v is None else self.tensor(float(v), node) for v in (lo, hi)]
            return self.emit("Clip", [x, *bounds], base)
        if t in _SOFTMAX:
            dim = args[1] if len(args) > 1 else node.kwargs.get("dim", -1)
            return self.emit(_SOFTMAX[t], [x], base, axis=dim)
        name = getattr(t, "__name__", str(t))
        if name in ("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"):
            kw = node.normalized_arguments(self.gm, normalize_to_only_use_kwargs=True).kwargs
            if name == "adaptive_avg_pool2d":
                return self.adaptive(x, node, kw["output_size"], base)
            return self.pool(x, kw, "MaxPool" if name == "max_pool2d" else "AveragePool",
                             base)
        raise ValueError(f"node {node.name!r} ({_describe(node, self.modules)}) has no ONNX "
                         "form in lowbit.to_onnx")

    def batch_flatten(self, node: fx.Node) -> bool:
        src, out = node.args[0].meta.get("tensor_meta"), node.meta["tensor_meta"]
        return src is not None and len(out.shape) == 2 and out.shape[0] == src.shape[0] \
            and len(src.shape) >= 2


def _fetch(gm: nn.Module, target: str) -> object:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _describe(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    if node.op == "call_module":
        return type(modules[node.target]).__name__
    return f"{node.op} {getattr(node.target, '__name__', node.target)}"


def to_onnx(model: nn.Module, example_input: torch.Tensor, path: str | os.PathLike
            ) -> object:
    """Write `model` (a lowbit fake-quant model in eval mode, one tensor in, one out) to `path`
    as a QCDQ ONNX model (module docstring); returns the onnx.ModelProto. `example_input`
    (float NCHW) gives the shapes. TypeError / ValueError naming the argument or the node for
    what has no Q/DQ form; FileNotFoundError for a missing folder; ImportError without onnx."""
    onnx = require_onnx()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example_input, torch.Tensor) or not example_input.is_floating_point():
        raise TypeError("example_input must be a floating-point torch.Tensor, got "
                        f"{getattr(example_input, 'dtype', type(example_input).__name__)}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"path {str(path)!r}: folder {str(path.parent)!r} does not "
                                "exist")
    if not any(isinstance(m, (*QUANT_MODULES, StandaloneQuant)) for m in model.modules()):
        raise ValueError("model has no lowbit fake-quant layers: call lowbit.quantize (and "
                         "calibrate or train) first, or lowbit.from_onnx")
    try:
        graph = _Tracer().trace(model)
    except Exception as e:
        raise ValueError(f"model cannot be traced by torch.fx ({type(e).__name__}: {e}); "
                         "to_onnx needs a traceable forward") from None
    gm = fx.GraphModule(model, graph)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(example_input)
    finally:
        model.train(was_training)
    writer = _Writer(gm)
    inputs, output = [], None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            writer.tensors[node.name] = "input"
            writer.used.add("input")
            inputs.append(node)
        elif node.op == "output":
            output = node.args[0]
        else:
            writer.write(node)
    if len(inputs) != 1 or not isinstance(output, fx.Node):
        raise ValueError("model must take one tensor and return one tensor")
    out = writer.tensor(output, output)
    writer.nodes.append(onnx.helper.make_node("Identity", [out], ["output"], name="output"))
    f = onnx.TensorProto.FLOAT
    shape_in = ["batch", *example_input.shape[1:]]
    shape_out = ["batch", *output.meta["tensor_meta"].shape[1:]]
    g = onnx.helper.make_graph(
        writer.nodes, "lowbit", [onnx.helper.make_tensor_value_info("input", f, shape_in)],
        [onnx.helper.make_tensor_value_info("output", f, shape_out)], writer.inits)
    proto = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", OPSET)],
                                   producer_name="lowbit")
    if writer.binary:
        onnx.helper.set_model_props(proto, {BINARY_WEIGHTS_KEY: json.dumps(writer.binary)})
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return proto


__all__ = ["OPSET", "to_onnx"]

"""From ONNX Q/DQ to lowbit: `from_onnx(path)` reads a quantize-dequantize ONNX model into a
fake-quant lowbit model (the kind `lowbit.quantize` makes) that `lowbit.convert` and
`lowbit.compile` run. `lowbit.to_onnx` (onnx_export.py) writes the same form back.

Forms read: QCDQ, QuantizeLinear -> Clip -> DequantizeLinear, as Brevitas's
`export_onnx_qcdq` writes it at 2-8 bits (its TorchScript exporter stores integer weights, its
dynamo exporter float weights and a QuantizeLinear); QDQ without the Clip, as NVIDIA ModelOpt
writes it for TensorRT at 8 bits (int8 or float weights).

- Activation Q/DQ (on a tensor computed from the input): one scale per tensor, zero point 0.
  Bits and encoding from the integer range, the Clip's where there is one, else the zero
  point's type (int8 / uint8, int4 / uint4): [0, 2^b - 1] is unsigned b bits, [-2^(b-1),
  2^(b-1) - 1] signed b bits (b >= 2). It becomes the `act_quant` (an LSQActQuantizer holding
  the file's scale as its step) of each conv / linear that reads it, directly or through
  ReLU, max-pool, flatten or a Q/DQ of the same scale and range (they commute with a symmetric
  quantizer: max(Q(x)) = Q(max(x)), relu(Q(x)) = Q(relu(x))). Any other reader (a residual
  add, concat, average pool, BatchNorm, the output) reads it through a `StandaloneQuant`
  module, which `lowbit.compile` runs in float (its plan says so).
- Weight Q/DQ (on a constant): per tensor or per output channel, zero point 0, integers taken
  exactly: the layer's float weight is int * scale and its LSQWeightQuantizer's step the
  file's scale, so `lowbit.convert` gives back the file's integers. Bits: the smallest signed
  width holding the range (Brevitas's narrow 2-bit range [-1, 1] is held by s2); binary
  (-1/+1) where `to_onnx` marked the tensor in the model's metadata (`BINARY_WEIGHTS_KEY`).
- Layers: Conv (2-D; groups, dilation or a non-square stride / padding make a float conv:
  lowbit's integer conv has none), Gemm (transA = 0, alpha = beta = 1), MatMul with a constant
  right operand (and an Add of a constant bias after it); a layer whose input or weight is not
  quantized stays float (nn.Conv2d / nn.Linear with the dequantized weights).
- Other ops: BatchNormalization (inference), Relu, MaxPool, AveragePool, GlobalAveragePool,
  Flatten, Reshape that flattens from dim 1, Add (residual; Sub / Mul / Div too, in float),
  Concat, Identity, Dropout, Clip on float values, Softmax / LogSoftmax, and constant
  subgraphs (folded with onnx's reference evaluator). Anything else, a zero point other than
  0, a per-channel activation scale, a narrow-range activation or weights wider than 8 bits
  raise a ValueError naming the node and its op.

Rounding: ONNX's QuantizeLinear rounds half to even (as Brevitas's own forward does); lowbit
rounds half up (`quant.quantize.round_half_up`). Weights: the file's integers are taken
exactly (dequantized weights quantize back to the same integers). Activations: the two rules
differ only where x / scale is exactly k + 0.5 (k even for positive x), which the float
activations of a trained network essentially never hit; lowbit's rule is kept (it is what its
kernels compute).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from .api import conv_unsupported_reason
from .modules import QuantConv2d, QuantLinear
from .onnx_ops import (
    FLOAT_BINARY,
    FloatOps,
    FloatValue,
    IntTensor,
    act_scale,
    attributes,
    axis_view,
    identifier,
    module_path,
    node_label,
    same_quant,
    set_params,
)
from .qdq_modules import (
    BINARY_WEIGHTS_KEY,
    StandaloneQuant,
    act_precision,
    fixed_act_quantizer,
    fixed_weight_quantizer,
    integer_ranges,
    require_onnx,
    weight_bits,
)

_DOMAINS = ("", "ai.onnx")
SUPPORTED_OPS = ("QuantizeLinear", "Clip", "DequantizeLinear", "Conv", "Gemm", "MatMul",
                 "BatchNormalization", "Relu", "MaxPool", "AveragePool", "GlobalAveragePool",
                 "Flatten", "Reshape", *FLOAT_BINARY, "Concat", "Identity", "Dropout",
                 "Softmax", "LogSoftmax", "Constant")


class _Reader(FloatOps):
    """ONNX graph -> fx graph of lowbit modules (module docstring)."""

    def __init__(self, model: object) -> None:
        onnx = require_onnx()
        self.onnx = onnx
        self.graph = model.graph
        self.ranges = integer_ranges()
        self.consts: dict[str, np.ndarray] = {}
        self.types: dict[str, int] = {}
        self.ints: dict[str, IntTensor] = {}
        self.weights: dict[str, IntTensor] = {}
        self.vals: dict[str, FloatValue] = {}
        meta = {p.key: p.value for p in model.metadata_props}
        self.binary = set(json.loads(meta.get(BINARY_WEIGHTS_KEY, "[]")))
        for t in self.graph.initializer:
            value = onnx.numpy_helper.to_array(t)
            # integers as int64 (int4 / int2 arrive as ml_dtypes); their type stays in types
            self.consts[t.name] = value.astype(np.int64) if t.data_type in self.ranges \
                else value
            self.types[t.name] = t.data_type
        self.shapes = self._infer_shapes(model)
        self.readers: dict[str, int] = {}
        for n in self.graph.node:
            for i in n.input:
                self.readers[i] = self.readers.get(i, 0) + 1
        for o in self.graph.output:
            self.readers[o.name] = self.readers.get(o.name, 0) + 1
        self.fx = fx.Graph()
        self.root = nn.Module()
        self.names: set[str] = set()

    def _infer_shapes(self, model: object) -> dict[str, tuple[int | None, ...]]:
        try:
            inferred = self.onnx.shape_inference.infer_shapes(model)
        except Exception:  # shapes only refine the Reshape check
            inferred = model
        g = inferred.graph
        shapes = {}
        for v in (*g.input, *g.value_info, *g.output):
            t = v.type.tensor_type
            if t.HasField("shape"):
                shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                       for d in t.shape.dim)
        return shapes

    # ---------------------------------------------------------------- modules and nodes
    def unique(self, base: str) -> str:
        """A fresh attribute name of the model from an ONNX name."""
        stem = name = identifier(base)
        i = 1
        while name in self.names:
            i += 1
            name = f"{stem}_{i}"
        self.names.add(name)
        return name

    def call(self, base: str, module: nn.Module, *args: fx.Node) -> fx.Node:
        name = self.unique(base)
        self.root.add_module(name, module)
        return self.fx.call_module(name, args)

    def buffer(self, base: str, value: np.ndarray) -> fx.Node:
        name = self.unique(base)
        self.root.register_buffer(name, torch.from_numpy(np.array(value, dtype=np.float32)))
        return self.fx.get_attr(name)

    def materialize(self, v: FloatValue) -> fx.Node:
        """The node of v's value with its pending quantizer applied (a StandaloneQuant)."""
        if v.quant is None:
            return v.node
        if v.done is None:
            q = v.quant
            module = StandaloneQuant(act_precision(q.lo, q.hi, q.label), act_scale(q))
            v.done = self.call(f"{q.name}_quant", module, v.node)
        return v.done

    def val(self, name: str, node: object) -> FloatValue:
        if name not in self.vals:
            what = "an integer tensor (a QuantizeLinear's output)" if name in self.ints else \
                "a constant" if name in self.consts else "undefined"
            raise ValueError(f"{node_label(node)}: input {name!r} is {what}: lowbit reads a float "
                             "tensor computed from the model input here")
        return self.vals[name]

    def const(self, name: str, node: object, what: str) -> np.ndarray:
        if name not in self.consts:
            raise ValueError(f"{node_label(node)}: {what} {name!r} must be a constant")
        return self.consts[name]

    # ---------------------------------------------------------------- read
    def read(self) -> fx.GraphModule:
        inputs = [i for i in self.graph.input if i.name not in self.consts]
        if len(inputs) != 1:
            raise ValueError(f"the model must have one input tensor (lowbit.compile runs "
                             f"forward(x)), got {[i.name for i in inputs]}")
        if len(self.graph.output) != 1:
            raise ValueError(f"the model must have one output tensor, got "
                             f"{[o.name for o in self.graph.output]}")
        shape = self.shapes.get(inputs[0].name)
        self.vals[inputs[0].name] = FloatValue(self.fx.placeholder("x"),
                                               None if shape is None else len(shape))
        for node in self.graph.node:
            if node.domain not in _DOMAINS:
                raise ValueError(f"{node_label(node)}: operator domain {node.domain!r} is not "
                                 "supported (standard ONNX only; Brevitas: export with "
                                 "brevitas.export.export_onnx_qcdq)")
            self.node(node)
        out = self.graph.output[0].name
        if out not in self.vals:
            raise ValueError(f"output {out!r} is not a float tensor computed from the input")
        self.fx.output(self.materialize(self.vals[out]))
        gm = fx.GraphModule(self.root, self.fx, class_name="OnnxQDQModel")
        gm.graph.lint()
        return gm.eval()

    def node(self, node: object) -> None:
        op = node.op_type
        if op in ("QuantizeLinear", "Clip", "DequantizeLinear") and self._quant_op(node):
            return
        if all(not i or i in self.consts for i in node.input):
            self._fold(node)
            return
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise ValueError(f"{node_label(node)}: op {op} is not supported by lowbit.from_onnx "
                             f"(supported: {', '.join(SUPPORTED_OPS)})")
        handler(node, attributes(node))

    def _fold(self, node: object) -> None:
        from onnx.reference import ReferenceEvaluator

        feeds = {i: self.consts[i] for i in node.input if i}
        try:
            outs = ReferenceEvaluator(node).run(None, feeds)
        except Exception as e:
            raise ValueError(f"{node_label(node)}: cannot evaluate this constant op "
                             f"({type(e).__name__}: {e})") from None
        for name, value in zip(node.output, outs, strict=False):
            self.consts[name] = np.asarray(value)

    # ---------------------------------------------------------------- Q / Clip / DQ
    def _scale_zp(self, node: object) -> tuple[np.ndarray, np.ndarray | None]:
        scale = self.const(node.input[1], node, "scale").astype(np.float32)
        zp = None
        if len(node.input) > 2 and node.input[2]:
            zp = self.const(node.input[2], node, "zero point")
            if np.any(np.asarray(zp, dtype=np.int64) != 0):
                raise ValueError(f"{node_label(node)}: zero point {np.asarray(zp).ravel()[:4]} is "
                                 "not 0: lowbit quantizes symmetrically (asymmetric Q/DQ is "
                                 "not supported)")
        if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            raise ValueError(f"{node_label(node)}: scale must be finite and > 0, got "
                             f"{scale.ravel()[:4]}")
        if attributes(node).get("block_size", 0):
            raise ValueError(f"{node_label(node)}: blocked quantization is not supported")
        return scale, zp

    def _int_type(self, node: object, zp_name: str | None) -> tuple[int, int]:
        if zp_name:
            t = self.types.get(zp_name) or self.onnx.helper.np_dtype_to_tensor_dtype(
                self.consts[zp_name].dtype)
        else:
            t = attributes(node).get("output_dtype") or self.onnx.TensorProto.UINT8
        if t not in self.ranges:
            raise ValueError(f"{node_label(node)}: quantized type "
                             f"{self.onnx.TensorProto.DataType.Name(t)} is not an integer type")
        return self.ranges[t]

    def _quant_op(self, node: object) -> bool:
        """Handle a Q / Clip / DQ of the integer domain; False for any other (a Clip of a
        float tensor, a Q / DQ of constants only, folded)."""
        op, x = node.op_type, node.input[0]
        if op == "QuantizeLinear":
            scale, _ = self._scale_zp(node)
            lo, hi = self._int_type(node, node.input[2] if len(node.input) > 2 else None)
            axis = attributes(node).get("axis", 1)
            ints = IntTensor(node_label(node), module_path(node), lo, hi, scale, axis)
            if x in self.consts:
                w = self.consts[x].astype(np.float32)
                ints.values = np.clip(np.rint(w / axis_view(scale, w.ndim, axis)), lo,
                                      hi).astype(np.int64)
            else:
                ints.source = self.val(x, node)
            self.ints[node.output[0]] = ints
            return True
        ints = self.ints.get(x) or self._const_ints(x, node)
        if ints is None:
            if op == "DequantizeLinear" and x not in self.consts:
                raise ValueError(f"{node_label(node)}: reads {x!r}, which is no QuantizeLinear "
                                 "output (nor its Clip) and no integer constant")
            return False
        if op == "Clip":
            a = attributes(node)
            lo = self._bound(node, 1, a.get("min", -math.inf))
            hi = self._bound(node, 2, a.get("max", math.inf))
            new = dataclasses.replace(ints, lo=max(ints.lo, math.ceil(lo)),
                                      hi=min(ints.hi, math.floor(hi)))
            if new.values is not None:
                new.values = np.clip(new.values, new.lo, new.hi)
            self.ints[node.output[0]] = new
            return True
        scale, _ = self._scale_zp(node)
        axis = attributes(node).get("axis", 1)
        if ints.scale is not None and (ints.scale.shape != scale.shape
                                       or not np.array_equal(ints.scale, scale)):
            raise ValueError(f"{node_label(node)}: its scale differs from the QuantizeLinear's "
                             f"({ints.label}): a requantization, not a Q/DQ pair")
        if ints.source is None:
            self.weights[node.output[0]] = dataclasses.replace(ints, scale=scale, axis=axis)
            self.consts[node.output[0]] = (ints.values.astype(np.float32)
                                           * axis_view(scale, ints.values.ndim, axis))
            return True
        if scale.size != 1:
            raise ValueError(f"{node_label(node)}: per-channel activation scales ({scale.size} "
                             "values) are not supported: lowbit quantizes an activation with "
                             "one scale per tensor")
        act_precision(ints.lo, ints.hi, ints.label)  # refused here, not at its reader
        src = ints.source
        if src.quant is not None and not same_quant(src.quant, ints):
            base = self.materialize(src)
        else:
            base = src.node  # no pending Q, or the same Q again: Q(Q(x)) = Q(x)
        self.vals[node.output[0]] = FloatValue(base, src.rank, ints)
        return True

    def _bound(self, node: object, index: int, default: float | None) -> float | None:
        if len(node.input) > index and node.input[index]:
            return float(self.const(node.input[index], node, "Clip bound").item())
        return default

    def _const_ints(self, name: str, node: object) -> IntTensor | None:
        """An integer constant (weights stored as integers) as IntTensor over its type's range."""
        if name not in self.consts or self.consts[name].dtype.kind not in "iu":
            return None
        value = self.consts[name]
        if name in self.types:
            lo, hi = self.ranges[self.types[name]]
        else:  # computed by a folded node: the range of its numpy type
            lo, hi = int(np.iinfo(value.dtype).min), int(np.iinfo(value.dtype).max)
        return IntTensor(node_label(node), identifier(name), lo, hi,
                         values=value.astype(np.int64))

    # ---------------------------------------------------------------- layers
    def _weight(self, node: object, name: str, k_axis: int) -> tuple[np.ndarray, IntTensor | None]:
        """(float weight, its integers or None if not quantized); checks the scale's axis."""
        w = self.const(name, node, "weight")
        ints = self.weights.get(name)
        if ints is not None and ints.scale.size != 1:
            axis = ints.axis % w.ndim
            if axis != k_axis or ints.scale.size != w.shape[k_axis]:
                raise ValueError(f"{node_label(node)}: weight scales along axis {ints.axis} "
                                 f"({ints.scale.size} values): lowbit's weight scales are "
                                 "per output channel")
        return w.astype(np.float32), ints

    def _quant_layer(self, node: object, layer: nn.Module, x: FloatValue,
                     ints: IntTensor | None) -> fx.Node:
        """`layer` (float, weights set) as a QuantConv2d / QuantLinear reading x, or float."""
        why = conv_unsupported_reason(layer) if isinstance(layer, nn.Conv2d) else None
        if ints is None or x.quant is None or why:
            return self.call(module_path(node), layer, self.materialize(x))
        k = layer.weight.shape[0]
        scale = np.broadcast_to(ints.scale.reshape(-1), (k,)).copy()
        if node.input[1] in self.binary:
            if not np.isin(ints.values, (-1, 1)).all():
                raise ValueError(f"{node_label(node)}: weights marked binary hold values other "
                                 "than -1 / +1")
            bits = 1
        else:
            bits = weight_bits(ints.lo, ints.hi, ints.label)
        name = self.unique(module_path(node))
        act = fixed_act_quantizer(act_precision(x.quant.lo, x.quant.hi, x.quant.label),
                                  act_scale(x.quant), name)
        cls = QuantConv2d if isinstance(layer, nn.Conv2d) else QuantLinear
        self.root.add_module(name, cls.from_float(layer, fixed_weight_quantizer(bits, scale,
                                                                                name), act))
        return self.fx.call_module(name, (x.node,))

    def op_Conv(self, node: object, a: dict) -> None:
        x = self.val(node.input[0], node)
        w, ints = self._weight(node, node.input[1], 0)
        if w.ndim != 4:
            raise ValueError(f"{node_label(node)}: only 2-D convolutions are supported")
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise ValueError(f"{node_label(node)}: auto_pad={a['auto_pad']!r} (explicit pads only)")
        pads = list(a.get("pads", [0, 0, 0, 0]))
        if pads[:2] != pads[2:]:
            raise ValueError(f"{node_label(node)}: asymmetric pads {pads}")
        bias = self._bias(node, 2, w.shape[0])
        groups = a.get("group", 1)
        conv = nn.Conv2d(w.shape[1] * groups, w.shape[0], tuple(w.shape[2:]),
                         tuple(a.get("strides", (1, 1))), tuple(pads[:2]),
                         tuple(a.get("dilations", (1, 1))), groups, bias is not None)
        set_params(conv, w, bias)
        self.vals[node.output[0]] = FloatValue(self._quant_layer(node, conv, x, ints), 4)

    def _bias(self, node: object, index: int, k: int) -> np.ndarray | None:
        if len(node.input) <= index or not node.input[index]:
            return None
        b = self.const(node.input[index], node, "bias").astype(np.float32)
        if b.size not in (1, k) or (b.ndim == 2 and b.shape[0] != 1):
            raise ValueError(f"{node_label(node)}: bias of shape {b.shape} (one value per output "
                             "only)")
        return np.broadcast_to(b.reshape(-1), (k,)).copy()

    def _linear(self, node: object, x: FloatValue, w: np.ndarray, ints: IntTensor | None,
                k_axis: int, bias: np.ndarray | None) -> None:
        weight = w if k_axis == 0 else w.T
        lin = nn.Linear(weight.shape[1], weight.shape[0], bias is not None)
        set_params(lin, weight, bias)
        out = self._quant_layer(node, lin, x, ints)
        module = self.root.get_submodule(out.target)
        self.vals[node.output[0]] = FloatValue(out, 2, linear=module if bias is None else None)

    def op_Gemm(self, node: object, a: dict) -> None:
        x = self.val(node.input[0], node)
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or (
                len(node.input) > 2 and node.input[2] and a.get("beta", 1.0) != 1.0):
            raise ValueError(f"{node_label(node)}: only transA=0, alpha=1, beta=1 are supported")
        k_axis = 0 if a.get("transB", 0) else 1
        w, ints = self._weight(node, node.input[1], k_axis)
        self._linear(node, x, w, ints, k_axis, self._bias(node, 2, w.shape[k_axis]))

    def op_MatMul(self, node: object, a: dict) -> None:
        x = self.val(node.input[0], node)
        if node.input[1] not in self.consts or self.consts[node.input[1]].ndim != 2:
            raise ValueError(f"{node_label(node)}: MatMul needs a constant 2-D right operand "
                             "(a linear layer's weight)")
        w, ints = self._weight(node, node.input[1], 1)
        self._linear(node, x, w, ints, 1, None)


def from_onnx(path: str | os.PathLike | object) -> fx.GraphModule:
    """A lowbit fake-quant model (a torch.fx GraphModule of QuantConv2d / QuantLinear with the
    file's scales, bit widths and integer weights, BatchNorm, ReLU, pools...; eval mode) from
    the Q/DQ ONNX model at `path` (or an onnx.ModelProto). What is read, how it maps and the
    rounding rule: module docstring of `lowbit.quant.onnx_qdq`. Run it as is, or through
    `lowbit.convert` / `lowbit.compile`; it fine-tunes with lowbit's LSQ QAT (the file's
    scales are the LSQ steps).

    FileNotFoundError for a missing file; ValueError naming the node and op for what lowbit's
    model cannot hold; ImportError without the onnx package."""
    onnx = require_onnx()
    if isinstance(path, onnx.ModelProto):
        model = path
    else:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str, os.PathLike or onnx.ModelProto, got "
                            f"{type(path).__name__}")
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"path {str(p)!r}: no such ONNX file")
        try:
            model = onnx.load(str(p))
        except Exception as e:
            raise ValueError(f"path {str(p)!r} is not a readable ONNX model "
                             f"({type(e).__name__}: {e})") from None
    return _Reader(model).read()


__all__ = ["SUPPORTED_OPS", "from_onnx"]

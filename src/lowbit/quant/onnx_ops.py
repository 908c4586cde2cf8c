"""The pieces of the ONNX Q/DQ reader (`onnx_qdq.from_onnx`) besides the layers and Q/DQ
chains: the value records, node naming, and the ops that are not conv / linear layers (ReLU,
pools, BatchNorm, flatten, residual arithmetic, concat, clamp, softmax), as `FloatOps`, a mixin
of the reader."""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from .qdq_modules import require_onnx

FLOAT_BINARY = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul,
                "Div": operator.truediv}


@dataclass(eq=False)
class IntTensor:
    """An integer tensor of the file: a QuantizeLinear's output (activation: `source`) or an
    integer constant (weights: `values`), its range narrowed by Clips, its scale (the Q's, or
    the DequantizeLinear's for a constant)."""

    label: str
    name: str
    lo: int
    hi: int
    scale: np.ndarray | None = None
    axis: int = 1
    values: np.ndarray | None = None
    source: FloatValue | None = None


@dataclass(eq=False)
class FloatValue:
    """A float tensor computed from the input: `node`, then `quant` (a pending activation Q/DQ:
    the value is quant(node)); `done`: the node with quant applied, once built; `linear`: the
    bias-less linear module whose fresh output this is (an Add of a constant may be its bias)."""

    node: fx.Node
    rank: int | None
    quant: IntTensor | None = None
    done: fx.Node | None = None
    linear: nn.Linear | None = None


def node_label(node: object) -> str:
    """How errors name an ONNX node: node 'name' (OpType)."""
    return f"node {node.name or '(unnamed)'!r} ({node.op_type})"


def attributes(node: object) -> dict:
    onnx = require_onnx()
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def module_path(node: object) -> str:
    """The exporting module's path where the file records it (torch's dynamo exporter: the
    node's name scopes; its TorchScript exporter: "/c1/Conv"), cut before the quantizer
    sub-modules (c1.weight_quant... -> c1); else the node's name."""
    scopes = {p.key: p.value for p in getattr(node, "metadata_props", ())}.get(
        "pkg.torch.onnx.name_scopes")
    path = ""
    if scopes:
        try:
            parts = ast.literal_eval(scopes)
            path = parts[-2] if isinstance(parts, list) and len(parts) >= 3 else ""
        except (ValueError, SyntaxError):
            path = ""
    elif node.name.startswith("/") and node.name.count("/") >= 2:
        path = node.name[1:].rsplit("/", 1)[0].replace("/", ".")
    path = re.split(r"\.(?:act|weight|input|output|bias)_quant\b", str(path))[0]
    return path or node.name or node.op_type


def identifier(name: str) -> str:
    """A Python identifier (a module attribute name) from an ONNX name."""
    s = re.sub(r"\W+", "_", name).strip("_") or "node"
    return s if s[0].isalpha() else "n_" + s


def axis_view(scale: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A per-axis scale reshaped to broadcast against a tensor of `ndim` dims."""
    if scale.size == 1:
        return scale.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return scale.reshape(shape)


def act_scale(q: IntTensor) -> float:
    return float(q.scale.reshape(-1)[0])


def same_quant(a: IntTensor, b: IntTensor) -> bool:
    return (a.lo, a.hi) == (b.lo, b.hi) and a.scale.size == b.scale.size == 1 and \
        float(a.scale.reshape(-1)[0]) == float(b.scale.reshape(-1)[0])


def set_params(layer: nn.Module, weight: np.ndarray, bias: np.ndarray | None) -> None:
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32)))
        if bias is not None:
            layer.bias.copy_(torch.from_numpy(bias))


class FloatOps:
    """op_<OnnxOp>(node, attributes) of the ops besides layers and Q/DQ (the reader provides
    vals, consts, shapes, readers, fx, val, const, call, buffer, materialize and _bound)."""

    def _unary(self, node: object, module: nn.Module, keep_quant: bool) -> None:
        """module(x); keep_quant: it commutes with x's pending quantizer (which stays)."""
        x = self.val(node.input[0], node)
        src = x.node if keep_quant else self.materialize(x)
        out = self.call(module_path(node), module, src)
        self.vals[node.output[0]] = FloatValue(out, x.rank, x.quant if keep_quant else None)

    def op_Relu(self, node: object, a: dict) -> None:
        self._unary(node, nn.ReLU(), keep_quant=True)

    def _window(self, node: object, a: dict, ceil_ok: bool = False
                ) -> tuple[tuple, tuple, tuple]:
        k = tuple(a["kernel_shape"])
        pads = list(a.get("pads", [0] * 2 * len(k)))
        if len(k) != 2 or pads[:2] != pads[2:] or (a.get("ceil_mode", 0) and not ceil_ok) or \
                tuple(a.get("dilations", (1, 1))) != (1, 1) or \
                a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise ValueError(f"{node_label(node)}: only 2-D windows with symmetric explicit "
                             "pads, no dilation and ceil_mode=0 (MaxPool: either) are "
                             "supported")
        return k, tuple(a.get("strides", (1, 1))), tuple(pads[:2])

    def op_MaxPool(self, node: object, a: dict) -> None:
        if len(node.output) > 1 and node.output[1]:
            raise ValueError(f"{node_label(node)}: the indices output is not supported")
        k, s, p = self._window(node, a, ceil_ok=True)
        ceil = bool(a.get("ceil_mode", 0))
        self._unary(node, nn.MaxPool2d(k, s, p, ceil_mode=ceil), keep_quant=True)

    def op_AveragePool(self, node: object, a: dict) -> None:
        k, s, p = self._window(node, a)
        self._unary(node, nn.AvgPool2d(k, s, p, count_include_pad=bool(
            a.get("count_include_pad", 0))), keep_quant=False)

    def op_GlobalAveragePool(self, node: object, a: dict) -> None:
        self._unary(node, nn.AdaptiveAvgPool2d(1), keep_quant=False)

    def op_BatchNormalization(self, node: object, a: dict) -> None:
        if a.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
            raise ValueError(f"{node_label(node)}: only inference BatchNormalization is "
                             "supported")
        gamma, beta, mean, var = (self.const(n, node, "BatchNorm parameter").astype(np.float32)
                                  for n in node.input[1:5])
        x = self.val(node.input[0], node)
        bn = (nn.BatchNorm1d if x.rank == 2 else nn.BatchNorm2d)(gamma.size,
                                                                 eps=a.get("epsilon", 1e-5))
        with torch.no_grad():
            for t, v in ((bn.weight, gamma), (bn.bias, beta), (bn.running_mean, mean),
                         (bn.running_var, var)):
                t.copy_(torch.from_numpy(v.reshape(-1)))
        self._unary(node, bn.eval(), keep_quant=False)

    def _flatten(self, node: object) -> None:
        x = self.val(node.input[0], node)
        if x.rank == 2:
            self.vals[node.output[0]] = x
            return
        out = self.fx.call_function(torch.flatten, (x.node, 1))
        self.vals[node.output[0]] = FloatValue(out, 2, x.quant)

    def op_Flatten(self, node: object, a: dict) -> None:
        if a.get("axis", 1) != 1:
            raise ValueError(f"{node_label(node)}: Flatten axis={a.get('axis')} (only 1)")
        self._flatten(node)

    def op_Reshape(self, node: object, a: dict) -> None:
        target = [int(v) for v in self.const(node.input[1], node, "shape").reshape(-1)]
        shape = self.shapes.get(node.input[0])
        rest = math.prod(shape[1:]) if shape and None not in shape[1:] else None
        batch = shape[0] if shape else None
        ok = len(target) == 2 and not (a.get("allowzero", 0) and 0 in target) and (
            (target[1] == -1 and target[0] in (0, batch))
            or (rest is not None and target[1] == rest and target[0] in (0, -1, batch)))
        if not ok:
            raise ValueError(f"{node_label(node)}: Reshape to {target} from {shape}: only a "
                             "flatten from dim 1 is supported")
        self._flatten(node)

    def _alias(self, node: object, a: dict) -> None:
        self.vals[node.output[0]] = self.val(node.input[0], node)

    op_Identity = _alias
    op_Dropout = _alias

    def _binary(self, node: object, a: dict) -> None:
        names = node.input[:2]
        if node.op_type == "Add" and self._fuse_bias(node):
            return
        args, rank = [], None
        for i, n in enumerate(names):
            if n in self.consts:
                args.append(self.buffer(f"{module_path(node)}_const{i}", self.consts[n]))
            else:
                v = self.val(n, node)
                rank = rank or v.rank
                args.append(self.materialize(v))
        out = self.fx.call_function(FLOAT_BINARY[node.op_type], tuple(args))
        self.vals[node.output[0]] = FloatValue(out, rank)

    op_Add = op_Sub = op_Mul = op_Div = _binary

    def _fuse_bias(self, node: object) -> bool:
        """MatMul + Add(constant [N]): the constant becomes the linear layer's bias."""
        a, b = node.input[:2]
        x, c = (a, b) if b in self.consts else (b, a)
        v = self.vals.get(x)
        if c not in self.consts or v is None or v.linear is None or self.readers.get(x) != 1:
            return False
        bias = self.consts[c].astype(np.float32).reshape(-1)
        n = v.linear.out_features
        if bias.size not in (1, n):
            return False
        v.linear.bias = nn.Parameter(torch.from_numpy(np.broadcast_to(bias, (n,)).copy()))
        v.linear = None
        self.vals[node.output[0]] = v
        return True

    def op_Concat(self, node: object, a: dict) -> None:
        vals = [self.val(n, node) for n in node.input]
        rank = vals[0].rank
        axis = a.get("axis", 1)
        dim = axis % rank if rank else axis
        out = self.fx.call_function(torch.cat, ([self.materialize(v) for v in vals], dim))
        self.vals[node.output[0]] = FloatValue(out, rank)

    def op_Clip(self, node: object, a: dict) -> None:
        x = self.val(node.input[0], node)
        bounds = (self._bound(node, 1, a.get("min")), self._bound(node, 2, a.get("max")))
        if bounds == (None, None):
            self.vals[node.output[0]] = x
            return
        out = self.fx.call_function(torch.clamp, (self.materialize(x), *bounds))
        self.vals[node.output[0]] = FloatValue(out, x.rank)

    def _softmax(self, node: object, a: dict) -> None:
        x = self.val(node.input[0], node)
        fn = torch.softmax if node.op_type == "Softmax" else torch.log_softmax
        out = self.fx.call_function(fn, (self.materialize(x), a.get("axis", -1)))
        self.vals[node.output[0]] = FloatValue(out, x.rank)

    op_Softmax = op_LogSoftmax = _softmax

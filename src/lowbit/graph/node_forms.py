"""Forms of fx nodes the value graph turns into integer ops (`lowbit.graph.dataflow`):
clamps (ReLU6, Hardtanh, `torch.clamp`, `clamp_min` / `clamp_max` with constant bounds),
activation functions computed as a table of their quantized input, spatial means, products
of two tensors, channel selections (`chunk`, `split`, `x[:, a:b]`) and the view / transpose /
view of a channel shuffle, an eval BatchNorm's affine form (`batchnorm_affine`). Each
recognizer reads one node (or module) and returns its parameters, or None where it is not of
its form; `describe` names what a node computes."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ..quant.residual import MUL_TARGETS, TABLE_ACTIVATIONS, TABLE_FUNCTIONS

_CLAMP_TARGETS = {torch.clamp, torch.clip, "clamp", "clip", "clamp_", "clip_"}
_MEAN_TARGETS = {torch.mean, "mean"}
_CHUNK_TARGETS = {torch.chunk, "chunk"}
_SPLIT_TARGETS = {torch.split, "split"}
_VIEW_TARGETS = {"view", "reshape", torch.reshape}
_TRANSPOSE_TARGETS = {"transpose", torch.transpose}


def _const(v: object) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _arg(node: fx.Node, i: int, name: str, default: object = None) -> object:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def clamp_bounds(node: fx.Node, m: nn.Module | None = None
                 ) -> tuple[float | None, float | None] | None:
    """(lo, hi) of a clamp node (a module `m` for call_module nodes), None for other nodes or
    bounds that are no constants."""
    if m is not None:
        if isinstance(m, nn.Hardtanh):  # ReLU6 included
            return float(m.min_val), float(m.max_val)
        return None
    t = node.target
    if t in (F.relu6, "relu6"):
        return 0.0, 6.0
    if t in (F.hardtanh, "hardtanh", "hardtanh_"):
        lo, hi = _arg(node, 1, "min_val", -1.0), _arg(node, 2, "max_val", 1.0)
    elif t in _CLAMP_TARGETS:
        lo, hi = _arg(node, 1, "min"), _arg(node, 2, "max")
    elif t in (torch.clamp_min, "clamp_min", "clamp_min_"):
        lo, hi = _arg(node, 1, "min"), None
    elif t in (torch.clamp_max, "clamp_max", "clamp_max_"):
        lo, hi = None, _arg(node, 1, "max")
    else:
        return None
    if not (_const(lo) and _const(hi)) or (lo is None and hi is None):
        return None
    if lo is not None and hi is not None and not lo <= hi:
        return None
    return (None if lo is None else float(lo)), (None if hi is None else float(hi))


def is_table_activation(node: fx.Node, m: nn.Module | None = None) -> bool:
    """An activation function of `TABLE_ACTIVATIONS` / `TABLE_FUNCTIONS`."""
    if m is not None:
        return isinstance(m, TABLE_ACTIVATIONS)
    return node.op in ("call_function", "call_method") and node.target in TABLE_FUNCTIONS


def mean_keepdim(node: fx.Node, shape: tuple[int, ...]) -> bool | None:
    """keepdim of a mean over the two spatial dims of an NCHW map (`x.mean((2, 3))`), None for
    other nodes."""
    if node.target not in _MEAN_TARGETS or len(shape) != 4:
        return None
    dims = _arg(node, 1, "dim")
    if not isinstance(dims, (tuple, list)) or node.kwargs.get("dtype") is not None:
        return None
    if sorted(d % 4 for d in dims) != [2, 3]:
        return None
    keep = _arg(node, 2, "keepdim", False)
    return bool(keep) if isinstance(keep, bool) else None


def is_mul(node: fx.Node) -> bool:
    return node.target in MUL_TARGETS and len(node.args) == 2 and not node.kwargs


def is_eval_stochastic_depth(node: fx.Node) -> bool:
    """torchvision's stochastic depth in eval mode (the identity)."""
    name = getattr(node.target, "__name__", "")
    return node.op == "call_function" and name == "stochastic_depth" and \
        _arg(node, 3, "training", True) is False


def split_parts(node: fx.Node, parts: object) -> list[int] | None:
    """Channel counts of the parts of a chunk / split along dim 1 of an NCHW map (parts: the
    recorded tuple of tensors), None for other nodes."""
    if node.target in _CHUNK_TARGETS:
        dim = _arg(node, 2, "dim", 0)
    elif node.target in _SPLIT_TARGETS:
        dim = _arg(node, 2, "dim", 0)
    else:
        return None
    if not isinstance(parts, (tuple, list)) or not parts or \
            not all(isinstance(p, torch.Tensor) and p.dim() == 4 for p in parts):
        return None
    if not isinstance(dim, int) or dim % 4 != 1:
        return None
    return [int(p.shape[1]) for p in parts]


def slice_channels(node: fx.Node, channels: int) -> list[int] | None:
    """The channels `x[:, a:b:c]` (or `x[:, a:b, :, :]`) keeps of an NCHW map, None for other
    getitem nodes."""
    if node.target is not operator.getitem or len(node.args) != 2:
        return None
    idx = node.args[1]
    if not isinstance(idx, tuple) or len(idx) < 2 or idx[0] != slice(None):
        return None
    if any(i not in (slice(None), Ellipsis) for i in idx[2:]):
        return None
    if not isinstance(idx[1], slice) or not all(_const(v) for v in (idx[1].start, idx[1].stop,
                                                                     idx[1].step)):
        return None
    return list(range(channels))[idx[1]]


@dataclass(frozen=True)
class ChannelView:
    """A view of an NCHW map's channels as a [N, A, B, H, W] tensor: `index[a, b]` is the
    map channel at (a, b) (transposes move it)."""

    index: torch.Tensor


def channel_view(node: fx.Node, in_shape: tuple[int, ...], out_shape: tuple[int, ...]
                 ) -> ChannelView | None:
    """The view / reshape of a map [N, C, H, W] to [N, A, B, H, W] (A B = C) that opens a
    channel shuffle."""
    if node.target not in _VIEW_TARGETS or len(in_shape) != 4 or len(out_shape) != 5:
        return None
    n, c, h, w = in_shape
    if (out_shape[0], *out_shape[3:]) != (n, h, w) or out_shape[1] * out_shape[2] != c:
        return None
    return ChannelView(torch.arange(c).view(out_shape[1], out_shape[2]))


def transpose_view(node: fx.Node, view: ChannelView) -> ChannelView | None:
    """A transpose of dims 1 and 2 of a channel view."""
    if node.target not in _TRANSPOSE_TARGETS or len(node.args) != 3:
        return None
    if sorted(d % 5 for d in node.args[1:]) != [1, 2]:
        return None
    return ChannelView(view.index.t().contiguous())


def closes_view(node: fx.Node, out_shape: tuple[int, ...], view: ChannelView) -> bool:
    """The view / reshape / flatten(1, 2) of a channel view back to a map [N, C, H, W]."""
    if node.target not in (*_VIEW_TARGETS, torch.flatten, "flatten") or len(out_shape) != 4:
        return False
    return out_shape[1] == view.index.numel()


def describe(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    """A short name of what an fx node computes."""
    if node.op == "call_module":
        m = modules[node.target]
        extra = m.extra_repr()
        return f"{node.target}: {type(m).__name__}({extra[:60]})"
    name = getattr(node.target, "__name__", str(node.target))
    stack = [path for path, _ in (node.meta.get("nn_module_stack") or {}).values() if path]
    return f"{node.op.removeprefix('call_')} {name}" + (f" in {stack[-1]}" if stack else "")


def batchnorm_affine(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(a, b) float64 per channel of an eval BatchNorm, y = a x + b (a = weight /
    sqrt(running_var + eps), b = bias - running_mean a), or None where it normalizes by batch
    statistics (no running statistics) or they are not finite."""
    if not isinstance(m, nn.modules.batchnorm._BatchNorm) or m.running_mean is None or \
            m.running_var is None:
        return None
    a = 1.0 / torch.sqrt(m.running_var.double() + m.eps)
    if m.weight is not None:
        a = a * m.weight.detach().double()
    b = -m.running_mean.double() * a
    if m.bias is not None:
        b = b + m.bias.detach().double()
    if not bool(torch.isfinite(a).all()) or not bool(torch.isfinite(b).all()):
        return None
    return a, b

"""`summary(model)`: one row per conv / linear layer of a float, fake-quant or converted model:
its precision, clip method and scales, or that it is kept float and why.

Fake-quant layers describe themselves here; any other module that defines
`summary_row(name) -> LayerRow` (the integer layers of `lowbit.runtime`, a compiled plan's
layers) gives its own row. Float conv / linear layers carry the reason `lowbit.quantize` left
them float (`lowbit_float_reason`), or get one from what they are.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

from rich.console import Console
from rich.table import Table
from torch import nn

from .api import FLOAT_REASON, is_layer, unsupported_reason
from .modules import QUANT_MODULES
from .residual import ATTR as RESIDUAL_ATTR
from .residual import residual_quantizers

NEVER_OBSERVED = "never observed"
#: the state of a residual-stream quantizer's row (`lowbit.quant.residual`)
RESIDUAL_STATE = "stream"
NOT_QUANTIZED = "not quantized (lowbit.quantize was not applied)"


@dataclass(frozen=True)
class LayerRow:
    """One layer. state: "fake-quant", "integer" (converted), "float", or "stream" (a residual
    stream quantizer: its act precision, method and scale); weight / act:
    precision names ("s4", "u2", "b1"; act None before any data); act_scale: real units per
    integer step; weight_scale_min/max: range of the per-channel weight scales; reason: why a
    layer is float (or a warning about a quantized one), "" otherwise."""

    name: str
    type: str
    state: str
    weight: str | None = None
    act: str | None = None
    method: str | None = None
    act_scale: float | None = None
    weight_scale_min: float | None = None
    weight_scale_max: float | None = None
    reason: str = ""

    @property
    def kept_float(self) -> bool:
        return self.state == "float"

    def to_dict(self) -> dict:
        return asdict(self)


def _fake_quant_row(name: str, layer: nn.Module) -> LayerRow:
    aq, wq = layer.act_quant, layer.weight_quant
    method = aq.method + ("+mix" if aq.mix is not None else "")
    act = scale = None
    reason = ""
    if int(aq.observer.seen) == 0:
        reason = NEVER_OBSERVED
    else:
        act = str(aq.precision())
        try:
            scale = aq.scale()
        except (RuntimeError, ValueError) as e:
            reason = str(e)
    ws = wq.scale(layer.weight)
    return LayerRow(name, type(layer).__name__, "fake-quant", str(wq.prec), act, method, scale,
                    float(ws.min()), float(ws.max()), reason)


def _float_row(name: str, layer: nn.Module, quantized_model: bool) -> LayerRow:
    reason = getattr(layer, FLOAT_REASON, None)
    if reason is None:
        reason = (unsupported_reason(layer) or "not quantized") if quantized_model \
            else NOT_QUANTIZED
    return LayerRow(name, type(layer).__name__, "float", reason=reason)


def layer_rows(model: nn.Module) -> list[LayerRow]:
    """The rows of `summary`, without printing."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    mods = list(model.named_modules())
    quantized = any(isinstance(m, QUANT_MODULES) or hasattr(m, "summary_row")
                    for _, m in mods)
    rows, inside = [], ()
    for name, m in mods:
        if inside and name.startswith(inside):
            continue  # a lowbit layer's own parts
        if isinstance(m, QUANT_MODULES):
            rows.append(_fake_quant_row(name, m))
        elif callable(getattr(m, "summary_row", None)):
            rows.append(m.summary_row(name))
        elif is_layer(m):
            rows.append(_float_row(name, m, quantized))
        else:
            continue
        inside = name + "." if name else ""
    for name, q in residual_quantizers(model).items():
        seen = int(q.observer.seen) > 0
        act = str(q.precision()) if seen and q.signed is not None else None
        rows.append(LayerRow(f"{name}.{RESIDUAL_ATTR}", type(q).__name__, RESIDUAL_STATE,
                             act=act, method=q.method, act_scale=q.scale() if seen else None,
                             reason=f"the output of {name or 'the model'} (residual stream)"
                             if seen else NEVER_OBSERVED))
    return rows


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def render(rows: list[LayerRow], title: str = "lowbit summary") -> Table:
    """A rich table of `rows`, with a caption counting quantized and float layers."""
    table = Table(title=title)
    for col in ("layer", "state", "w", "a", "method", "a scale", "w scales", "note"):
        table.add_column(col, justify="left" if col in ("layer", "note") else "right")
    for r in rows:
        ws = "-" if r.weight_scale_min is None else \
            f"{r.weight_scale_min:.2g}..{r.weight_scale_max:.2g}"
        table.add_row(r.name or "(model)", r.state if r.state != "float" else
                      f"float ({r.type})", r.weight or "-", r.act or "-", r.method or "-",
                      _num(r.act_scale), ws, r.reason)
    n_float = sum(r.kept_float for r in rows)
    stream = [r for r in rows if r.state == RESIDUAL_STATE]
    table.caption = f"{len(rows) - n_float - len(stream)} quantized, {n_float} kept float" + (
        f"; residual stream: {len(stream)} quantizers "
        f"({', '.join(sorted({r.act or '?' for r in stream}))})" if stream else "")
    return table


def summary(model: nn.Module, *, show: bool = True, console: Console | None = None
            ) -> list[LayerRow]:
    """Every conv / linear layer of `model` (float, fake-quant or converted) as a LayerRow:
    precision, method, scales, or kept float and why; printed as a rich table when `show`
    (to `console`, default stdout)."""
    if console is not None and not callable(getattr(console, "print", None)):
        raise TypeError(f"console must be a rich.console.Console, got {type(console).__name__}")
    rows = layer_rows(model)
    if show or console is not None:
        # a pipe or a file gets a wide table rather than a wrapped one
        default = Console(width=None if sys.stdout.isatty() else 140)
        (console or default).print(render(rows))
    return rows

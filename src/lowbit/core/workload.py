"""Frozen, hashable descriptions of one conv2d or GEMM layer; the key of every tuning record.

Conv2d: activations x [N, H, W, C] (NHWC), weights w [K, R, S, C / groups] (KRSC), output
[N, P, Q, K]; with groups > 1, filter k reads input channels [g (C / groups), (g + 1) (C /
groups)) of its group g = k // (K / groups) (depthwise: groups == C == K).
GEMM:   a [M, K], b [N, K] (both K-contiguous), output [M, N].
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import ClassVar

from .epilogue import Epilogue
from .layout import PACKABLE_BITS, Layout
from .precision import Precision

_U8 = Precision(8)
_S8 = Precision(8, "signed")


def _check_layout(name: str, layout: Layout, prec: Precision) -> Layout:
    try:
        layout = Layout(layout)
    except ValueError:
        allowed = ", ".join(x.value for x in Layout)
        raise ValueError(f"{name} must be one of {allowed}, got {layout!r}") from None
    if layout is Layout.PACKED and prec.bits not in PACKABLE_BITS:
        raise ValueError(f"{name} 'packed' needs bits in {PACKABLE_BITS}, got {prec.bits}")
    return layout


def _positive(obj: object, names: tuple[str, ...], minimum: int = 1) -> None:
    for n in names:
        v = getattr(obj, n)
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{type(obj).__name__}.{n} must be an int, got {v!r}")
        if v < minimum:
            raise ValueError(f"{type(obj).__name__}.{n} must be >= {minimum}, got {v}")


@dataclass(frozen=True)
class Workload:
    """Common part: operand precisions, storage layouts and the epilogue."""

    w: Precision = _S8
    a: Precision = _S8
    epilogue: Epilogue = field(default_factory=Epilogue)
    w_layout: Layout = Layout.INT8
    a_layout: Layout = Layout.INT8

    op: ClassVar[str] = "abstract"
    _shape_fields: ClassVar[tuple[str, ...]] = ()

    def _check_common(self) -> None:
        for n in ("w", "a"):
            v = getattr(self, n)
            if isinstance(v, str):
                object.__setattr__(self, n, Precision.parse(v))
            elif not isinstance(v, Precision):
                raise TypeError(f"{type(self).__name__}.{n} must be a Precision, got {v!r}")
        if isinstance(self.epilogue, dict):
            object.__setattr__(self, "epilogue", Epilogue.from_dict(self.epilogue))
        if not isinstance(self.epilogue, Epilogue):
            raise TypeError(f"epilogue must be an Epilogue, got {self.epilogue!r}")
        object.__setattr__(self, "w_layout", _check_layout("w_layout", self.w_layout, self.w))
        object.__setattr__(self, "a_layout", _check_layout("a_layout", self.a_layout, self.a))

    @property
    def precision_name(self) -> str:
        """'w1a2' style name (bits only)."""
        return f"w{self.w.bits}a{self.a.bits}"

    def _shape_items(self) -> list[tuple[str, int]]:
        """(name, value) of the shape fields the key and to_dict carry."""
        return [(n, getattr(self, n)) for n in self._shape_fields]

    @property
    def key(self) -> str:
        """Canonical string: op, shape, precisions, layouts and epilogue."""
        shape = ",".join(f"{n}={v}" for n, v in self._shape_items())
        return (f"{self.op}({shape})|w={self.w}/{self.w_layout.value}"
                f"|a={self.a}/{self.a_layout.value}|{self.epilogue.key}")

    def to_dict(self) -> dict:
        d = {"op": self.op}
        d.update(self._shape_items())
        d.update(w=str(self.w), a=str(self.a), w_layout=self.w_layout.value,
                 a_layout=self.a_layout.value, epilogue=self.epilogue.to_dict())
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def replace(self, **changes: object) -> Workload:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(changes)
        return type(self)(**d)

    @property
    def ops(self) -> int:
        """Multiply-accumulates x 2."""
        raise NotImplementedError


@dataclass(frozen=True)
class ConvWorkload(Workload):
    """conv2d with square stride and symmetric zero padding (padding contributes value 0),
    in `groups` channel groups (C and K multiples of it; the key and to_dict name groups only
    where it is not 1, so the records of ungrouped convs keep their keys)."""

    N: int = 1
    H: int = 1
    W: int = 1
    C: int = 1
    K: int = 1
    R: int = 1
    S: int = 1
    stride: int = 1
    pad: int = 0
    groups: int = 1

    op: ClassVar[str] = "conv2d"
    _shape_fields: ClassVar[tuple[str, ...]] = ("N", "H", "W", "C", "K", "R", "S", "stride", "pad")

    def __post_init__(self) -> None:
        _positive(self, ("N", "H", "W", "C", "K", "R", "S", "stride", "groups"))
        _positive(self, ("pad",), minimum=0)
        if self.C % self.groups or self.K % self.groups:
            raise ValueError(f"ConvWorkload: C={self.C} and K={self.K} must be multiples of "
                             f"groups={self.groups}")
        if self.P < 1 or self.Q < 1:
            raise ValueError(
                f"ConvWorkload: output is empty (P={self.P}, Q={self.Q}) for H={self.H}, "
                f"W={self.W}, R={self.R}, S={self.S}, stride={self.stride}, pad={self.pad}")
        self._check_common()

    def _shape_items(self) -> list[tuple[str, int]]:
        items = super()._shape_items()
        return items if self.groups == 1 else [*items, ("groups", self.groups)]

    @property
    def depthwise(self) -> bool:
        """One input and one output channel per group (groups == C == K)."""
        return self.groups == self.C == self.K

    @property
    def P(self) -> int:
        return (self.H + 2 * self.pad - self.R) // self.stride + 1

    @property
    def Q(self) -> int:
        return (self.W + 2 * self.pad - self.S) // self.stride + 1

    @property
    def gemm_shape(self) -> tuple[int, int, int]:
        """(M, N, K) of the implicit GEMM: M = N*P*Q pixels, N = K filters, K = R*S*C/groups
        (the reduction of one output: a grouped conv is `groups` such GEMMs side by side)."""
        return self.N * self.P * self.Q, self.K, self.R * self.S * (self.C // self.groups)

    @property
    def ops(self) -> int:
        m, n, k = self.gemm_shape
        return 2 * m * n * k


@dataclass(frozen=True)
class GemmWorkload(Workload):
    """out[M, N] = a[M, K] . b[N, K]^T."""

    M: int = 1
    N: int = 1
    K: int = 1

    op: ClassVar[str] = "gemm"
    _shape_fields: ClassVar[tuple[str, ...]] = ("M", "N", "K")

    def __post_init__(self) -> None:
        _positive(self, ("M", "N", "K"))
        self._check_common()

    @property
    def gemm_shape(self) -> tuple[int, int, int]:
        return self.M, self.N, self.K

    @property
    def ops(self) -> int:
        return 2 * self.M * self.N * self.K


_OPS = {"conv2d": ConvWorkload, "gemm": GemmWorkload}


def workload_from_dict(d: dict, **overrides: object) -> Workload:
    """Build a workload from a dict such as one entry of shared/workloads/*.json.

    Keys that are not fields of the workload (name, source) are ignored; `overrides` win.
    """
    d = {**d, **overrides}
    op = d.get("op")
    if op not in _OPS:
        raise ValueError(f"workload op must be one of {sorted(_OPS)}, got {op!r}")
    cls = _OPS[op]
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def workload_from_json(text: str) -> Workload:
    return workload_from_dict(json.loads(text))

"""Operand precision: a bit width and an encoding of the integer values those bits hold."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

import torch


class Encoding(str, Enum):
    """How the b bits of one element map to an integer value.

    unsigned: 0 .. 2^b - 1.  signed: two's complement, -2^(b-1) .. 2^(b-1) - 1.
    binary: one bit, 0 -> -1 and 1 -> +1 (XNOR-net / APNN-TC {-1,+1} operands).
    """

    UNSIGNED = "unsigned"
    SIGNED = "signed"
    BINARY = "binary"


_PREFIX = {Encoding.UNSIGNED: "u", Encoding.SIGNED: "s", Encoding.BINARY: "b"}
_FROM_PREFIX = {v: k for k, v in _PREFIX.items()}


@dataclass(frozen=True)
class Precision:
    """Bit width (1..8) and encoding of one integer operand."""

    bits: int
    encoding: Encoding = Encoding.UNSIGNED

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int):
            raise TypeError(f"Precision.bits must be an int in 1..8, got {self.bits!r}")
        try:
            enc = Encoding(self.encoding)
        except ValueError:
            allowed = ", ".join(e.value for e in Encoding)
            raise ValueError(
                f"Precision.encoding must be one of {allowed}, got {self.encoding!r}"
            ) from None
        object.__setattr__(self, "encoding", enc)
        if not 1 <= self.bits <= 8:
            raise ValueError(f"Precision.bits must be in 1..8, got {self.bits}")
        if enc is Encoding.BINARY and self.bits != 1:
            raise ValueError(f"Precision.bits must be 1 for the binary encoding, got {self.bits}")
        if enc is Encoding.SIGNED and self.bits < 2:
            raise ValueError("Precision.bits must be >= 2 for the signed encoding (1-bit: binary)")

    @property
    def qmin(self) -> int:
        """Smallest representable integer value."""
        if self.encoding is Encoding.UNSIGNED:
            return 0
        if self.encoding is Encoding.BINARY:
            return -1
        return -(1 << (self.bits - 1))

    @property
    def qmax(self) -> int:
        """Largest representable integer value."""
        if self.encoding is Encoding.UNSIGNED:
            return (1 << self.bits) - 1
        if self.encoding is Encoding.BINARY:
            return 1
        return (1 << (self.bits - 1)) - 1

    @property
    def name(self) -> str:
        """Short name: u4, s8, b1."""
        return f"{_PREFIX[self.encoding]}{self.bits}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> Precision:
        """Inverse of `name`: 'u4' -> Precision(4, unsigned)."""
        m = re.fullmatch(r"([usb])([1-8])", str(text).strip())
        if not m:
            raise ValueError(f"precision must look like u4, s8 or b1, got {text!r}")
        return cls(int(m.group(2)), _FROM_PREFIX[m.group(1)])


def parse_wa(text: str) -> tuple[int, int]:
    """'w1a2' -> (1, 2): the weight and activation bit widths of a precision pair name."""
    m = re.fullmatch(r"w([1-8])a([1-8])", str(text).strip())
    if not m:
        raise ValueError(f"precision pair must look like w1a2 (bits 1..8), got {text!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class WidePrecision:
    """Signed integers of 9..32 bits (two's complement), stored one value per element: int16
    up to 16 bits, else int32. The wide tensors of a network plan (residual adds, average
    pools: `lowbit.graph`) and the accumulators the Triton network ops read; it stands in for
    `Precision`, whose widths stop at 8 bits (same attributes)."""

    bits: int = 16
    encoding: Encoding = Encoding.SIGNED

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or \
                not 9 <= self.bits <= 32:
            raise ValueError(f"WidePrecision.bits must be an int in 9..32, got {self.bits!r}")
        if Encoding(self.encoding) is not Encoding.SIGNED:
            raise ValueError(f"WidePrecision is signed, got encoding {self.encoding!r}")

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1))

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def storage_dtype(self) -> torch.dtype:
        return torch.int16 if self.bits <= 16 else torch.int32

    @property
    def name(self) -> str:
        return f"s{self.bits}"

    def __str__(self) -> str:
        return self.name

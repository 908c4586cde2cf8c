"""Storage formats of integer tensors along their reduction (channel) dimension.

Dimension order is fixed per operand: activations NHWC, conv weights KRSC, GEMM A as M x K and
B as N x K (both K-contiguous). The layout says how the innermost dimension is stored:

- INT8:     one element per int8 byte (bits <= 8; unsigned values > 127 use uint8 storage).
- PACKED:   dense sub-byte packing along the innermost dim, 8 // bits elements per uint8,
            element i of a byte in bits [i*b, (i+1)*b) (LSB first); bits in {1, 2, 4}.
            Signed values store their two's-complement bit pattern.
- BITPLANE: APNN-TC channel-major bit planes: a tensor of shape [bits, *outer, ceil(C/32)] int32;
            bit (c % 32) of word c // 32 of plane i is bit i of element c. Padding channels are 0.
"""

from __future__ import annotations

from enum import Enum


class Layout(str, Enum):
    INT8 = "int8"
    PACKED = "packed"
    BITPLANE = "bitplane"


PACKABLE_BITS = (1, 2, 4)

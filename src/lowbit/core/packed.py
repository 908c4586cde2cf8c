"""PackedTensor: integer data in one of the storage layouts, with its precision and scale."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import Layout
from .precision import Precision


@dataclass(frozen=True, eq=False)
class PackedTensor:
    """A quantized tensor as it is stored.

    data:  the storage tensor (see `lowbit.core.layout` for each layout's shape and dtype).
    shape: the logical shape of the integer tensor (innermost dim = channels / K).
    scale: real value = scale * (q - zero_point); per tensor (0-d) or per channel of dim
           `axis`; None for raw integers.
    """

    data: torch.Tensor
    shape: tuple[int, ...]
    precision: Precision
    layout: Layout
    scale: torch.Tensor | None = None
    zero_point: torch.Tensor | None = None
    axis: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.data, torch.Tensor):
            raise TypeError(f"PackedTensor.data must be a torch.Tensor, got {type(self.data)}")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "layout", Layout(self.layout))

    @property
    def nbytes(self) -> int:
        """Bytes of the packed storage (the data tensor only)."""
        return self.data.numel() * self.data.element_size()

    @property
    def device(self) -> torch.device:
        return self.data.device

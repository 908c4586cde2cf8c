"""Exact semantics of a uint8 image entering a quantized network: what deployed pipelines
feed (decoded pixel values 0..255) instead of the float tensor the model was trained on.

The model's input is normalize(image) = ((v / 255) - mean[c]) / std[c] in float32
(torchvision's ToTensor then Normalize), quantized by the input quantizer
(`netops.quantize_float`). Per channel that is a function of the 256 pixel values, so it is a
table, table[c, v] (`netops.uint8_input_table`), and quantizing a uint8 image is a lookup:
`quantize_uint8_image`. `normalize_uint8_image` is the float path it replaces, step for step,
so the two agree exactly (tests check it)."""

from __future__ import annotations

import torch

__all__ = ["normalize_uint8_image", "quantize_uint8_image"]


def _uint8_image(image: object) -> torch.Tensor:
    if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8:
        got = image.dtype if isinstance(image, torch.Tensor) else type(image).__name__
        raise TypeError(f"image must be a uint8 torch.Tensor, got {got}")
    if image.dim() != 4:
        raise ValueError(f"image must be [N, C, H, W] (any memory format), got shape "
                         f"{tuple(image.shape)}")
    return image


def normalize_uint8_image(image: torch.Tensor, mean: tuple[float, ...] | torch.Tensor,
                          std: tuple[float, ...] | torch.Tensor) -> torch.Tensor:
    """uint8 [N, C, H, W] -> float32 ((v / 255) - mean[c]) / std[c], each step in float32
    (ToTensor, then Normalize)."""
    x = _uint8_image(image)
    mean_t = torch.as_tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)
    std_t = torch.as_tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
    if mean_t.numel() != x.shape[1] or std_t.numel() != x.shape[1]:
        raise ValueError(f"mean and std must have one value per channel ({x.shape[1]}), got "
                         f"{mean_t.numel()} and {std_t.numel()}")
    if not bool(torch.isfinite(mean_t).all()) or not bool((std_t > 0).all()) or \
            not bool(torch.isfinite(std_t).all()):
        raise ValueError("mean must be finite and std finite and > 0")
    return x.to(torch.float32).div(255).sub(mean_t.to(x.device)).div(std_t.to(x.device))


def quantize_uint8_image(image: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """uint8 [N, C, H, W] and an integer table [C, 256] -> int64 [N, C, H, W] with
    q[n, c, h, w] = table[c, image[n, c, h, w]] (any memory format; the result contiguous
    NCHW)."""
    x = _uint8_image(image)
    if not isinstance(table, torch.Tensor) or table.dtype.is_floating_point or \
            table.dtype == torch.bool:
        raise TypeError("table must be an integer torch.Tensor [C, 256]")
    if tuple(table.shape) != (x.shape[1], 256):
        raise ValueError(f"table must be [{x.shape[1]}, 256] (one row per channel), got "
                         f"{tuple(table.shape)}")
    t = table.to(torch.int64).to(x.device)
    chan = torch.arange(x.shape[1], device=x.device).view(1, -1, 1, 1)
    return t[chan, x.long()].contiguous()

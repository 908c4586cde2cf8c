"""What makes a saved model impossible to load silently wrong.

`save` writes the sha256 of every stored tensor (its dtype, shape and bytes) into the manifest,
and the sha256 of the manifest text under a second metadata key. `load` recomputes both and
checks every stored integer tensor that has a declared precision (integer weights) against
that precision's range. Any mismatch is a ValueError naming the file and the tensor.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import torch

from ..core import Encoding, Precision

MANIFEST_DIGEST_KEY = "lowbit.sha256"
DAMAGED = "the file is damaged (changed after lowbit.save wrote it): save the model again"


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (as safetensors stores them)."""
    h = hashlib.sha256(f"{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}|".encode())
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.numel():
        h.update(flat.view(torch.uint8).numpy().data)
    return h.hexdigest()


def tensor_digests(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    return {key: tensor_digest(t) for key, t in sorted(tensors.items())}


def check_manifest_digest(path: Path, text: str, digest: str | None, required: bool) -> None:
    """ValueError when the manifest text does not match its digest (or lacks a required one)."""
    if digest is None:
        if required:
            raise ValueError(f"{path}: the manifest has no digest ({MANIFEST_DIGEST_KEY}): "
                             f"{DAMAGED}")
        return
    if text_digest(text) != digest:
        raise ValueError(f"{path}: the manifest does not match its sha256: {DAMAGED}")


def check_tensors(path: Path, manifest: dict, tensors: Mapping[str, torch.Tensor]) -> None:
    """ValueError naming the first tensor whose digest differs from the manifest's, and any
    tensor the manifest lists that the file lacks (or the reverse)."""
    digests = manifest.get("tensors")
    if not isinstance(digests, dict):
        raise ValueError(f"{path}: the manifest lists no tensor digests: {DAMAGED}")
    missing = sorted(set(digests) - set(tensors))
    extra = sorted(set(tensors) - set(digests))
    if missing or extra:
        what = (f"tensor {missing[0]!r} is missing" if missing
                else f"tensor {extra[0]!r} is not in the manifest")
        raise ValueError(f"{path}: {what}: {DAMAGED}")
    for key in sorted(digests):
        if tensor_digest(tensors[key]) != digests[key]:
            raise ValueError(f"{path}: tensor {key!r} does not match its sha256 in the "
                             f"manifest: {DAMAGED}")


def check_ranges(path: Path, tensors: Mapping[str, torch.Tensor],
                 declared: Mapping[str, str]) -> int:
    """Check every tensor of `declared` ({key: precision name}) is an integer tensor whose
    values the precision can hold (binary: -1 and +1 only); returns how many were checked."""
    for key, name in declared.items():
        t = tensors.get(key)
        if t is None:
            raise ValueError(f"{path}: tensor {key!r} (declared {name}) is missing: {DAMAGED}")
        try:
            p = Precision.parse(name)
        except (ValueError, TypeError):
            raise ValueError(f"{path}: tensor {key!r} declares precision {name!r}, which is "
                             f"none: {DAMAGED}") from None
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{path}: tensor {key!r} is {t.dtype}, not the integers of its "
                             f"declared precision {p}: {DAMAGED}")
        if not t.numel():
            continue
        if p.encoding is Encoding.BINARY:
            bad = t[(t != -1) & (t != 1)]
        else:
            bad = t[(t < p.qmin) | (t > p.qmax)]
        if bad.numel():
            allowed = "-1 or +1" if p.encoding is Encoding.BINARY else f"{p.qmin}..{p.qmax}"
            raise ValueError(f"{path}: tensor {key!r} holds {int(bad[0])} ({bad.numel()} "
                             f"values) outside its declared precision {p} ({allowed}): "
                             f"{DAMAGED}")
    return len(declared)

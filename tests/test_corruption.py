"""Saved models cannot be silently wrong: one byte flipped in any stored tensor, in the manifest
or a weight outside its declared precision makes `lowbit.load` (and `lowbit summary`) raise a
ValueError naming the file and the tensor, for fake-quant, converted and compiled models."""

from __future__ import annotations

import json
import re
import shutil
import struct
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import lowbit
from lowbit.serialize import read_manifest
from lowbit.serialize.integrity import MANIFEST_DIGEST_KEY, tensor_digest, text_digest


def _layout(path: Path) -> tuple[int, dict]:
    """(offset of the data section, safetensors header) of a saved file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return 8 + n, json.loads(raw[8:8 + n])


def _flipped(src: Path, dst: Path, offset: int, mask: int = 0xFF) -> Path:
    raw = bytearray(src.read_bytes())
    raw[offset] ^= mask
    dst.write_bytes(bytes(raw))
    return dst


def _x(n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """A fake-quant, a converted and a compiled w2a2 digits ResNet, saved."""
    warnings.simplefilter("ignore")
    root = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    q = lowbit.quantize(lowbit.models.get("digits_resnet", num_classes=10, width=0.5),
                        weight_bits=2, act_bits=2)
    lowbit.calibrate(q, [_x(seed=s) for s in range(2)])
    models = {"fakequant": q, "converted": lowbit.convert(q), "compiled": lowbit.compile(q, _x())}
    return {kind: lowbit.save(m, root / f"{kind}.safetensors") for kind, m in models.items()}


@pytest.mark.parametrize("kind", ["fakequant", "converted", "compiled"])
def test_a_byte_flipped_in_any_tensor_is_refused_naming_it(saved, kind, tmp_path):
    src = saved[kind]
    lowbit.load(src)  # the intact file loads
    start, header = _layout(src)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert len(tensors) >= 10
    refused = 0
    for key, meta in tensors.items():
        begin, end = meta["data_offsets"]
        if end == begin:
            continue
        bad = _flipped(src, tmp_path / f"{kind}-bad.safetensors", start + (begin + end) // 2)
        with pytest.raises(ValueError) as err:
            lowbit.load(bad)
        assert str(bad) in str(err.value) and repr(key) in str(err.value), str(err.value)
        refused += 1
    assert refused == sum(m["data_offsets"][1] > m["data_offsets"][0] for m in tensors.values())


@pytest.mark.parametrize("kind", ["fakequant", "converted", "compiled"])
def test_a_byte_flipped_in_the_manifest_is_refused(saved, kind, tmp_path):
    """Changes that leave valid JSON: the version 2 -> 1 (a file without digests), the torch
    version's first digit, a tensor's name, a digest's first character."""
    src = saved[kind]
    raw = src.read_bytes()
    offsets = [raw.index(b'\\"version\\": 2') + len(b'\\"version\\": '),
               raw.index(b'\\"torch\\": \\"') + len(b'\\"torch\\": \\"'),
               raw.index(b'\\"tensors\\": {\\"') + len(b'\\"tensors\\": {\\"')]
    offsets.append(raw.index(b'\\": \\"', offsets[-1]) + len(b'\\": \\"'))
    for i, (offset, mask) in enumerate(zip(offsets, (3, 3, 1, 1), strict=True)):
        bad = _flipped(src, tmp_path / f"m{i}.safetensors", offset, mask)
        with pytest.raises(ValueError, match=rf"m{i}\.safetensors: the manifest does not "
                           r"match its sha256"):
            lowbit.load(bad)


def _rewritten(src: Path, dst: Path, key: str, edit) -> Path:
    """`src` with tensor `key` changed by `edit` and every digest made consistent again (a
    writer bug, not a damaged file: only the precision check can see it)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(src), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(src))
    tensors[key] = edit(tensors[key].clone())
    manifest = json.loads(meta["lowbit"])
    manifest["tensors"][key] = tensor_digest(tensors[key])
    text = json.dumps(manifest)
    save_file(tensors, str(dst), metadata={"lowbit": text, MANIFEST_DIGEST_KEY:
                                           text_digest(text)})
    return dst


@pytest.mark.parametrize("kind,key", [("converted", "blocks.0.conv1.weight"),
                                      ("compiled", "plan0.blocks_0_conv1.weight")])
def test_a_weight_outside_its_precision_is_refused(saved, kind, key, tmp_path):
    """The issue's case: the value -86 in a 2-bit layer (range -2..1)."""

    def plant(t):
        t.view(-1)[3] = -86
        return t

    bad = _rewritten(saved[kind], tmp_path / "range.safetensors", key, plant)
    with pytest.raises(ValueError, match=rf"range\.safetensors.*'{re.escape(key)}' holds -86"
                       r".*s2 \(-2\.\.1\)"):
        lowbit.load(bad)
    ok = _rewritten(saved[kind], tmp_path / "ok.safetensors", key, lambda t: t)
    lowbit.load(ok)  # the same rewrite without the bad value loads


def test_version_1_files_load_with_the_precision_checks(saved, tmp_path):
    """Files written before digests: still loadable, and still range-checked."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    src = saved["converted"]
    with safe_open(str(src), framework="pt") as f:
        manifest = json.loads(f.metadata()["lowbit"])
    manifest.pop("tensors")
    manifest["version"] = 1
    tensors = load_file(str(src))
    save_file(tensors, str(tmp_path / "v1.safetensors"),
              metadata={"lowbit": json.dumps(manifest)})
    x = _x(seed=3)
    assert torch.equal(lowbit.load(tmp_path / "v1.safetensors")(x), lowbit.load(src)(x))
    tensors["stem.0.weight"].view(-1)[0] = 5
    save_file(tensors, str(tmp_path / "v1bad.safetensors"),
              metadata={"lowbit": json.dumps(manifest)})
    with pytest.raises(ValueError, match=r"v1bad\.safetensors.*'stem\.0\.weight' holds 5"):
        lowbit.load(tmp_path / "v1bad.safetensors")
    manifest["version"] = 2  # a current file without its digests is damaged
    save_file(tensors, str(tmp_path / "v2.safetensors"),
              metadata={"lowbit": json.dumps(manifest)})
    with pytest.raises(ValueError, match=r"v2\.safetensors.*no digest"):
        lowbit.load(tmp_path / "v2.safetensors")


def test_lowbit_summary_refuses_a_damaged_file(saved, tmp_path):
    from lowbit.cli import app

    src = saved["converted"]
    start, header = _layout(src)
    begin, _ = header["blocks.0.conv1.weight"]["data_offsets"]
    bad = _flipped(src, tmp_path / "bad.safetensors", start + begin)
    good = CliRunner().invoke(app, ["summary", str(src)])
    assert good.exit_code == 0, good.output
    result = CliRunner().invoke(app, ["summary", str(bad)])
    assert result.exit_code == 2, result.output
    assert "blocks.0.conv1.weight" in result.output and "damaged" in result.output


FACTORY = """
from torch import nn

def model():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(256, 3))
"""


def test_a_factory_file_is_stored_relative_to_the_model_file(tmp_path):
    """Moved together, the model file and its architecture's file still load; without the
    architecture's file, the error says to pass model=."""
    src = tmp_path / "a"
    src.mkdir()
    (src / "nets.py").write_text(FACTORY)
    torch.manual_seed(0)
    q = lowbit.quantize(lowbit.serialize.build_model({"factory": f"{src}/nets.py:model"}),
                        weight_bits=4, act_bits=4)
    lowbit.calibrate(q, [_x()])
    c = lowbit.convert(q)
    lowbit.save(c, src / "m.safetensors", arch=f"{src}/nets.py:model")
    assert read_manifest(src / "m.safetensors")["arch"]["factory"] == "nets.py:model"
    moved = tmp_path / "elsewhere" / "b"
    shutil.copytree(src, moved)
    shutil.rmtree(src)
    x = _x(seed=1)
    assert torch.equal(lowbit.load(moved / "m.safetensors")(x), c(x))
    (moved / "nets.py").unlink()
    with pytest.raises(FileNotFoundError, match=r"nets\.py.*pass model="):
        lowbit.load(moved / "m.safetensors")

"""BatchNorms that fold into no layer on the integer path (`lowbit.graph.affine`): DenseNet's
concat -> BN -> ReLU -> conv, its transitions and its final norm -> ReLU -> pool ->
classifier, and a pre-activation block's BN on a quantized residual stream, as ChannelAffine
steps: no float fallback, the reference executor follows the fake-quant model, the GPU
executor (Triton under the interpreter on the CPU) equals the reference bit for bit, and the
Triton kernel equals `lowbit.reference.affine.channel_affine_int` on random inputs."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from any_cnn_cases import compiled, fallback_reasons, layer_inputs_exact
from engine_cases import layer_names
from lowbit.bench.recipes import randomize_batchnorms
from lowbit.core import Layout, PackedTensor, Precision, WidePrecision
from lowbit.graph.ir import ChannelAffine, Concat, Lookup, Plan
from lowbit.quant.packing import pack, unpack
from lowbit.reference.affine import channel_affine_int
from lowbit.runtime.engine import ReferenceExecutor

#: the model matrix's tolerance of integer-only logits against the fake-quant model
INTEGER_RTOL = 2e-2
#: the kernel tests' devices: the interpreter's CPU, a GPU where present
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class DenseLayer(nn.Module):
    """torchvision's dense layer: cat -> BN -> ReLU -> 1x1 conv -> BN -> ReLU -> 3x3 conv."""

    def __init__(self, cin: int, growth: int, bn_size: int = 2) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(F.relu(self.norm1(torch.cat(features, 1))))
        return self.conv2(F.relu(self.norm2(x)))


class TinyDenseNet(nn.Module):
    """Stem conv-BN-ReLU-maxpool, a dense block of two layers, a transition (BN -> ReLU -> 1x1
    conv -> 2x2 average pool), a block of one layer, norm5 -> ReLU -> global pool -> linear."""

    def __init__(self, init: int = 13, growth: int = 6) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(3, init, 3, padding=1, bias=False)
        self.norm0 = nn.BatchNorm2d(init)
        self.block1 = nn.ModuleList([DenseLayer(init, growth), DenseLayer(init + growth,
                                                                          growth)])
        c = init + 2 * growth
        self.norm_t = nn.BatchNorm2d(c)
        self.conv_t = nn.Conv2d(c, c // 2, 1, bias=False)
        self.block2 = nn.ModuleList([DenseLayer(c // 2, growth)])
        self.norm5 = nn.BatchNorm2d(c // 2 + growth)
        self.fc = nn.Linear(c // 2 + growth, 10)

    @staticmethod
    def _block(layers: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in layers:
            features.append(layer(features))
        return torch.cat(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.norm0(self.conv0(x))), 2)
        x = self._block(self.block1, x)
        x = F.avg_pool2d(self.conv_t(F.relu(self.norm_t(x))), 2)
        x = F.relu(self.norm5(self._block(self.block2, x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _unfolded(model: nn.Module) -> list[nn.BatchNorm2d]:
    """The BatchNorms no conv output feeds alone (the ChannelAffine steps to be)."""
    m = model
    return [m.block1[0].norm1, m.block1[1].norm1, m.norm_t, m.block2[0].norm1, m.norm5]


def _quantized(model: nn.Module, x: torch.Tensor, recipe: str, **kw) -> nn.Module:
    """Random BatchNorms (a third of the unfolded ones' gammas negative), quantized by a
    recipe 'wXaY' (first and last layer w8a8), calibrated on x."""
    model = model.eval()
    if all(m.track_running_stats for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        randomize_batchnorms(model, 0)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for bn in _unfolded(model) if isinstance(model, TinyDenseNet) else ():
            bn.weight.mul_(torch.where(torch.rand(bn.num_features, generator=g) < 0.3, -1, 1))
    w, a = int(recipe[1]), int(recipe[3])
    names = layer_names(model)
    eight = {"weight_bits": 8, "act_bits": 8}
    layers = {names[0]: eight, names[-1]: eight} if (w, a) != (8, 8) else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = lowbit.quantize(model, weight_bits=w, act_bits=a, layers=layers, **kw)
    lowbit.calibrate(q, [x])
    return q.eval()


def _x(size: int = 12, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def _plan(recipe: str, init: int = 13, growth: int = 6) -> tuple[nn.Module, Plan, torch.Tensor]:
    torch.manual_seed(0)
    x = _x()
    q = _quantized(TinyDenseNet(init, growth), x, recipe)
    return q, compiled(q, x).plan, x


@pytest.mark.parametrize("recipe", ["w8a8", "w2a2"])
def test_dense_block_batchnorms_are_channel_affine_steps(recipe):
    q, plan, x = _plan(recipe)
    assert not plan.fallbacks, fallback_reasons(plan)
    affine = plan.steps_of(ChannelAffine)
    assert len(affine) == len(_unfolded(q)) == 5
    assert len(plan.layers) == len(lowbit.quant.quant_layers(q)) == 9
    # the dense layers read every earlier feature map at its own realization: no concat
    assert not plan.steps_of(Concat)
    assert [len(s.parts) for s in affine] == [1, 2, 3, 1, 2]
    for s in affine:
        assert all(plan.tensors[p].is_wide for p in s.parts)  # float values of the model
        assert int((plan.params[s.multiplier] < 0).sum()) > 0  # the negative gammas
    norm5 = affine[-1]  # read by the global pool: wide, clamped at 0
    assert plan.tensors[norm5.output].is_wide and norm5.relu
    if recipe == "w2a2":  # bit-serial readers of 13 + 6 (+ 6) channels: values, then planes
        lookups = plan.steps_of(Lookup)
        assert {plan.tensors[s.output].layout for s in lookups} == {Layout.BITPLANE}
        assert len(lookups) == 2
    y = ReferenceExecutor(plan)(x)
    with torch.no_grad():
        yf = q(x)
    assert float((y - yf).abs().max()) <= INTEGER_RTOL * float(yf.abs().max())


def test_dense_block_layer_inputs_follow_the_model():
    """Each layer reads the fake-quant model's own quantized input, but for levels the
    24-bit reading of the BatchNorm's input flips at a rounding tie (none here)."""
    q, plan, x = _plan("w8a8")
    checked, _, _ = layer_inputs_exact(q, plan, x)
    assert checked == 9


def test_channel_the_input_cannot_move_is_a_constant():
    """A BatchNorm channel whose gamma is ~0: multiplier 0, the output its bias's level."""
    torch.manual_seed(0)
    x = _x()
    q = _quantized(TinyDenseNet(), x, "w8a8")
    with torch.no_grad():
        q.block1[1].norm1.weight[[0, 15]] = 1e-12
    plan = compiled(q, x).plan
    second = plan.steps_of(ChannelAffine)[1]
    m = plan.params[second.multiplier]
    assert m[0] == m[15] == 0 and int((m != 0).sum()) == m.numel() - 2
    y = ReferenceExecutor(plan)(x)
    with torch.no_grad():
        yf = q(x)
    assert float((y - yf).abs().max()) <= INTEGER_RTOL * float(yf.abs().max())


def test_aligned_parts_write_bit_planes_directly():
    """Parts of whole 32-channel words: the affine step writes the bit-serial layer's planes."""
    q, plan, x = _plan("w2a2", init=32, growth=32)
    assert not plan.fallbacks and not plan.steps_of(Lookup)
    planes = [s for s in plan.steps_of(ChannelAffine)
              if plan.tensors[s.output].layout is Layout.BITPLANE]
    assert len(planes) == 4  # every norm1 and the transition's
    y = ReferenceExecutor(plan)(x)
    with torch.no_grad():
        yf = q(x)
    assert float((y - yf).abs().max()) <= INTEGER_RTOL * float(yf.abs().max())


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_executor_equals_reference(device):
    """The GPU executor's ChannelAffine launches (Triton; under the interpreter on the CPU)
    and every other step, bit for bit against the reference on the same device."""
    from lowbit.runtime.gpu import GpuExecutor

    checked = 0
    cases = [("w8a8", 13, 6), ("w2a2", 32, 32)] + ([("w2a2", 13, 6)] if device == "cuda" else [])
    for recipe, init, growth in cases:
        q, plan, x = _plan(recipe, init, growth)
        plan = compiled(q.to(device), x.to(device)).plan
        ex = GpuExecutor(plan, device)
        y, rec = ex(x.to(device), record=True)
        y_ref, rec_ref = ReferenceExecutor(plan, device)(x.to(device), record=True)
        assert torch.equal(y, y_ref)
        for name, t in rec_ref.items():
            assert torch.equal(rec[name], t), name
            checked += 1
        assert sum(b.how.startswith("triton channel affine") for b in ex.steps) == 5
        if device == "cuda":  # the forward's CUDA graph, twice
            assert torch.equal(ex(x.to(device)), y_ref) and torch.equal(ex(x.to(device)), y_ref)
            checked += 2
    assert checked > 30


def test_gpu_executor_binds_one_launch_per_affine_step(monkeypatch):
    """Each ChannelAffine step of the tiny DenseNet (9 parts over 5 steps; values then a
    Lookup to bit planes at w2a2) is bound to one launch of the affine kernel, and a forward
    launches it once per step."""
    from lowbit.kernels.triton import stored
    from lowbit.kernels.triton.affine import affine_kernel
    from lowbit.runtime.gpu import GpuExecutor

    _, plan, x = _plan("w2a2")
    ex = GpuExecutor(plan, "cpu")
    calls = []
    real = stored.launch_or_compile

    def counted(fn, grid, args, kwargs, compile_only):
        calls.append(fn)
        return real(fn, grid, args, kwargs, compile_only)

    monkeypatch.setattr(stored, "launch_or_compile", counted)
    affine = [b for b in ex.steps if isinstance(b.step, ChannelAffine)]
    assert [len(b.step.parts) for b in affine] == [1, 2, 3, 1, 2]
    assert [b.how for b in affine] == [f"triton channel affine ({n} parts, one launch)"
                                       for n in (1, 2, 3, 1, 2)]
    per_step = []
    for b in affine:
        calls.clear()
        b()
        per_step.append(list(calls))
    assert per_step == [[affine_kernel]] * 5
    calls.clear()
    y = ex(x)
    assert calls.count(affine_kernel) == 5 and len(calls) > 5
    assert torch.equal(y, ReferenceExecutor(plan)(x))


class PreActBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(c), nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(c), nn.Conv2d(c, c, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.bn1(x)))
        return x + self.conv2(F.relu(self.bn2(out)))


class PreAct(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.blocks = nn.Sequential(PreActBlock(16), PreActBlock(16))
        self.bn, self.fc = nn.BatchNorm2d(16), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.blocks(self.stem(x))))
        return self.fc(x.mean((2, 3)))


def test_batchnorm_of_a_quantized_stream_reads_its_own_levels():
    """Pre-activation blocks with residual_bits=8: the BatchNorm after a block reads the
    block's residual quantizer's own 8-bit values and scale (no wide copy)."""
    torch.manual_seed(0)
    x = _x(8)
    q = _quantized(PreAct(), x, "w8a8", residual_bits=8)
    plan = compiled(q, x).plan
    assert not plan.fallbacks, fallback_reasons(plan)
    affine = plan.steps_of(ChannelAffine)
    assert len(affine) == 3  # blocks[0].bn1 reads the stem; blocks[1].bn1 and bn the stream
    narrow = [p for s in affine for p in s.parts if not plan.tensors[p].is_wide]
    assert len(narrow) == 2 and all(plan.tensors[p].precision.bits == 8 for p in narrow)
    y = ReferenceExecutor(plan)(x)
    with torch.no_grad():
        yf = q(x)
    assert float((y - yf).abs().max()) <= INTEGER_RTOL * float(yf.abs().max())


class CatScales(nn.Module):
    """Concatenation of a hardswish and a hardsigmoid output (each of a value quantized by
    its own activation quantizer, at its own scale) and a conv's read by a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 5, 3, padding=1)
        self.act_a, self.act_b = nn.Hardswish(), nn.Hardsigmoid()
        self.c, self.fc = nn.Conv2d(16, 8, 3, padding=1), nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.act_a(self.a(x)), self.act_b(self.b(x)), x], 1)
        return self.fc(self.c(x).mean((2, 3)))


def test_concat_of_values_at_different_scales():
    """Each part is written at the reader's scale (its own quantizer's values mapped by a
    table, the image quantized): the concatenation is exactly the reader's input."""
    torch.manual_seed(0)
    x = _x(8)
    q = _quantized(CatScales(), x, "w8a8")
    own = {float(m.input_quant.scale()) for m in (q.act_a, q.act_b)}
    plan = compiled(q, x).plan
    assert not plan.fallbacks, fallback_reasons(plan)
    (cat,) = plan.steps_of(Concat)
    assert {plan.tensors[p].scale for p in cat.parts} == {plan.tensors[cat.output].scale}
    assert plan.tensors[cat.output].scale not in own and len(own) == 2
    checked, _, _ = layer_inputs_exact(q, plan, x)
    assert checked == 4


def test_batchnorm_read_in_float_or_without_running_stats_falls_back():
    class Head(nn.Module):
        def __init__(self, track: bool) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.bn = nn.BatchNorm2d(8, track_running_stats=track)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(F.relu(self.conv(x)))  # the model's output: float

    x = _x(8)
    for track, reason in ((True, "a BatchNorm read in float"),
                          (False, "BatchNorm not directly after a fake-quant")):
        q = _quantized(Head(track), x, "w8a8")
        plan = compiled(q, x).plan
        (fb,) = plan.fallbacks
        assert fb.reason.startswith(reason), fb.reason
        assert not plan.steps_of(ChannelAffine)


def test_serialized_plan_keeps_its_affine_steps():
    _, plan, x = _plan("w8a8")
    again = Plan.from_dict(plan.to_dict(), plan.params, plan.modules)
    assert again.steps == plan.steps
    assert torch.equal(ReferenceExecutor(again)(x), ReferenceExecutor(plan)(x))


# ------------------------------------------------------------------ the Triton kernel
#: (parts: (precision, layout, channels)..., out precision, out layout)
KERNEL_CASES = [
    ((("s24", "int8", 5), ("s24", "int8", 13), ("s24", "int8", 40)), "u8", "int8"),
    ((("u8", "int8", 7),), "s8", "int8"),
    ((("s16", "int8", 32), ("u4", "bitplane", 64), ("s24", "int8", 7)), "u2", "bitplane"),
    ((("s8", "int8", 33), ("u2", "bitplane", 3)), "s24", "int8"),
    ((("s24", "int8", 1), ("u8", "int8", 130)), "s3", "int8"),
    ((("u1", "bitplane", 35),), "u4", "bitplane"),
    # every channel count, offset and row a multiple of 16: vector loads (ALIGN 16)
    ((("s24", "int8", 64), ("u8", "int8", 32), ("s16", "int8", 48)), "s8", "int8"),
]


def _prec(name: str) -> Precision | WidePrecision:
    return WidePrecision(int(name[1:])) if name in ("s16", "s24") else Precision.parse(name)


def _packed(v: torch.Tensor, prec, layout: Layout, device="cpu") -> PackedTensor:
    if isinstance(prec, WidePrecision):
        data = v.to(prec.storage_dtype)
    else:
        data = pack(v, prec, layout)
    return PackedTensor(data.to(device), tuple(v.shape), prec, layout)


def _kernel_case(parts, out_prec: str, out_layout: str, shape: tuple[int, ...], seed: int,
                 shift: tuple[int, int] = (20, 40), device: str = "cpu"):
    """Random parts (values, packed on `device`), (m, b, s) with m of either sign and every
    seventh channel constant (m = 0), and a poisoned out."""
    g = torch.Generator().manual_seed(seed)
    values, packed = [], []
    for prec_name, layout, c in parts:
        p = _prec(prec_name)
        v = torch.randint(p.qmin, p.qmax + 1, (*shape, c), generator=g)
        values.append(v)
        packed.append(_packed(v, p, Layout(layout), device))
    c = sum(p[2] for p in parts)
    m = torch.randint(-2**24, 2**24, (c,), generator=g)
    m[::7] = 0
    s = torch.randint(*shift, (c,), generator=g)
    b = torch.randint(-2**44, 2**44, (c,), generator=g)
    prec, layout = _prec(out_prec), Layout(out_layout)
    out = _packed(torch.zeros(*shape, c, dtype=torch.int64), prec, layout, device)
    out.data.fill_(0x5A if out.data.dtype.itemsize == 1 else -12345)  # poisoned
    return values, packed, (m, b, s), out


def _result(out: PackedTensor) -> torch.Tensor:
    """out's values, int64 on the CPU."""
    data = out.data.cpu()
    if isinstance(out.precision, WidePrecision):
        return data.to(torch.int64)
    return unpack(data, out.precision, out.layout, out.shape[-1]).to(torch.int64)


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: f"{len(c[0])}parts-{c[1]}")
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 7), (3, 1, 1)])
@pytest.mark.parametrize("device", DEVICES)
def test_triton_channel_affine_is_bit_exact(case, shape, device):
    from lowbit.kernels.triton.affine import bind_channel_affine

    parts, out_prec, out_layout = case
    checked = aligned = 0
    for relu in (False, True):
        values, packed, (m, b, s), out = _kernel_case(parts, out_prec, out_layout, shape,
                                                      seed=len(shape) + relu, device=device)
        ref = channel_affine_int(values, m, b, s, out.precision, relu)
        launcher = bind_channel_affine(packed, m, b, s, out, relu)
        assert len(launcher.launches) == 1
        aligned += launcher.launches[0].kwargs["ALIGN"] == 16
        launcher()
        assert torch.equal(_result(out), ref)
        assert ref.unique().numel() > 1  # not one clamped level
        checked += ref.numel()
    assert checked == 2 * torch.Size([*shape, sum(p[2] for p in parts)]).numel()
    assert aligned == (2 if all(p[2] % 16 == 0 for p in parts) else 0)


#: the kinds of part a step may read: (precision, layout)
PART_KINDS = (("s24", "int8"), ("u8", "int8"), ("s8", "int8"), ("s16", "int8"),
              ("u2", "bitplane"), ("u1", "bitplane"), ("s4", "bitplane"))
#: 23 parts of odd channel counts for an INT8 out; 21 of whole words but the last for planes
MANY_PARTS = {
    "int8": tuple((*PART_KINDS[i % 7], 2 * (i * 5 % 19) + 1) for i in range(23)),
    "bitplane": (*((*PART_KINDS[i % 7], 32 * (1 + i % 3)) for i in range(20)),
                 ("s16", "int8", 13)),
}


def _spread(parts, v: torch.Tensor, s: torch.Tensor, levels: int = 0) -> torch.Tensor:
    """Multipliers (levels=0: x m over a part's range moves the output up to 8 steps) or
    biases (up to `levels` steps) of v's signs and zeros, random magnitudes."""
    g = torch.Generator().manual_seed(int(s.sum()))
    top = torch.tensor([max(-_prec(p).qmin, _prec(p).qmax) for p, _, c in parts
                        for _ in range(c)], dtype=torch.float64)
    steps = 8 / top if levels == 0 else torch.full_like(top, levels)
    mag = torch.rand(v.shape, generator=g, dtype=torch.float64) * steps * 2.0**s.double()
    return (v.sign() * mag).to(torch.int64)


@pytest.mark.parametrize("out_prec,out_layout", [("u8", "int8"), ("s3", "bitplane"),
                                                 ("s24", "int8")])
@pytest.mark.parametrize("device", DEVICES)
def test_many_parts_of_every_kind_in_one_launch(out_prec, out_layout, device):
    """20+ parts of every kind (odd channel counts where the out allows), negative and zero
    multipliers (constant channels), ReLU's floor: one launch, equal to the reference."""
    from lowbit.kernels.triton.affine import affine_kernel, bind_channel_affine

    parts = MANY_PARTS[out_layout]
    checked = 0
    for relu in (False, True):
        values, packed, (m, b, s), out = _kernel_case(parts, out_prec, out_layout, (2, 3),
                                                      seed=7 + relu, shift=(36, 48),
                                                      device=device)
        m, b = _spread(parts, m, s), _spread(parts, b, s, levels=4)
        ref = channel_affine_int(values, m, b, s, out.precision, relu)
        launcher = bind_channel_affine(packed, m, b, s, out, relu)
        (launch,) = launcher.launches
        assert launch.fn is affine_kernel and len(launch.kwargs["KINDS"]) == 7
        assert all(a is b for a, b in zip(launcher.sources, (p.data for p in packed),
                                          strict=True))
        launcher()
        assert torch.equal(_result(out), ref)
        lo = max(out.precision.qmin, 0) if relu else out.precision.qmin
        inside = (ref > lo) & (ref < out.precision.qmax)
        assert inside.float().mean() > 0.15  # levels, not clamps
        constant = ref[..., m == 0].reshape(-1, int((m == 0).sum()))
        assert (constant == constant[:1]).all() and constant.shape[1] > 10
        if relu:  # the floor at 0 reached, by negative multipliers too
            assert int(ref.min()) == 0 and bool((ref[..., m < 0] == 0).any())
        checked += ref.numel()
    assert checked == 2 * 6 * sum(p[2] for p in parts)


def test_channel_tile_keeps_bit_plane_words_of_one_part():
    """The tile pads the fewest channels (the larger tile on a tie) and divides every part's
    channels but the last where those fill whole 32-channel words (a bit-plane out)."""
    from lowbit.kernels.triton.affine import channel_block

    cases = {(64, 32, 13): 32, (64, 128, 13): 32, (128, 256, 128): 128, (5, 13): 32,
             (64, 64): 64, (100,): 128, (128, 64, 64): 64, (64, 192, 1): 32}
    assert {k: channel_block(k) for k in cases} == cases
    g = torch.Generator().manual_seed(0)
    for _ in range(500):
        words = torch.randint(1, 9, (int(torch.randint(1, 6, (1,), generator=g)),),
                              generator=g) * 32
        if bool(torch.randint(0, 2, (1,), generator=g)):
            words = words * 2 ** int(torch.randint(1, 3, (1,), generator=g))
        widths = [*words.tolist(), int(torch.randint(1, 300, (1,), generator=g))]
        assert all(w % channel_block(widths) == 0 for w in widths[:-1]), widths


def test_alignment_hint_only_where_it_holds():
    """ALIGN (the kernel's vector-access hint) divides every part's channels, offset and row,
    and is 1 where a part's storage is not 16-byte aligned."""
    from lowbit.kernels.triton.affine import _alignment

    def parts(*spec):
        return [_packed(torch.zeros(2, c, dtype=torch.int64), _prec(p), Layout(lay))
                for p, lay, c in spec]

    s24, u8 = ("s24", "int8"), ("u8", "int8")
    cases = [(parts((*s24, 64), (*s24, 32), (*s24, 32)), 16), (parts((*s24, 64), (*u8, 40)), 8),
             (parts((*s24, 13), (*s24, 32)), 1), (parts((*s24, 32), ("u2", "bitplane", 64)), 2),
             (parts((*s24, 32), ("u2", "bitplane", 32)), 1)]
    got = [_alignment(p, [t.shape[-1] for t in p]) for p, _ in cases]
    assert got == [want for _, want in cases]
    shifted = parts((*s24, 64))[0]
    view = torch.empty(shifted.data.numel() + 1, dtype=torch.int32, )[1:]
    moved = PackedTensor(view.view(shifted.data.shape), shifted.shape, shifted.precision,
                         shifted.layout)
    assert _alignment([moved], [64]) == 1 and _alignment([shifted], [64]) == 16


def test_channel_affine_bad_inputs(monkeypatch):
    from lowbit.kernels.triton import affine
    from lowbit.kernels.triton.affine import bind_channel_affine

    parts = (("s24", "int8", 5), ("u8", "int8", 3))
    values, packed, (m, b, s), out = _kernel_case(parts, "u8", "int8", (2, 3), 0)
    with pytest.raises(TypeError, match="parts must be a non-empty list"):
        bind_channel_affine([], m, b, s, out)
    with pytest.raises(TypeError, match=r"parts\[1\] must be a lowbit.core.PackedTensor"):
        bind_channel_affine([packed[0], values[1]], m, b, s, out)
    with pytest.raises(ValueError, match="must add up to out's 8"):
        bind_channel_affine(packed[:1], m, b, s, out)
    with pytest.raises(TypeError, match=r"multiplier must be an integer torch\.Tensor"):
        bind_channel_affine(packed, m.double(), b, s, out)
    with pytest.raises(ValueError, match=r"shift must lie in \[1, 62\]"):
        bind_channel_affine(packed, m, b, s * 0, out)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        bind_channel_affine(packed, m, b[:3], s, out)
    with pytest.raises(ValueError, match="reaches 2\\^63"):
        bind_channel_affine(packed, m * 2**20, b, s.clamp(max=30), out)
    binary = _packed(torch.ones(2, 3, 8, dtype=torch.int64), Precision.parse("b1"),
                     Layout.INT8)
    other = _packed(torch.zeros(2, 3, 8, dtype=torch.int64), Precision(8), Layout.INT8, "meta")
    with pytest.raises(ValueError, match=r"parts\[0\]\.data is on meta"):
        bind_channel_affine([other], m, b, s, out)
    with pytest.raises(ValueError, match=r"out's shape but for its channels \(2, 3\)"):
        bind_channel_affine([packed[0], _packed(values[1][:1], Precision(8), Layout.INT8)],
                            m, b, s, out)
    with pytest.raises(ValueError, match="cannot be binary"):
        bind_channel_affine(packed, m, b, s, binary)
    planes = _packed(torch.zeros(2, 3, 8, dtype=torch.int64), Precision(2), Layout.BITPLANE)
    with pytest.raises(ValueError, match="fill whole 32-channel words"):
        bind_channel_affine(packed, m, b, s, planes)
    with pytest.raises(TypeError, match="relu must be a bool"):
        bind_channel_affine(packed, m, b, s, out, relu=1)
    with monkeypatch.context() as patch:
        patch.setattr(affine, "MAX_TILES", 1)
        with pytest.raises(ValueError, match="make 2 tiles of 32; one launch takes at most 1"):
            bind_channel_affine(packed, m, b, s, out)
    with pytest.raises(ValueError, match="parts\\[1\\] must have parts\\[0\\]'s shape"):
        channel_affine_int([values[0], values[1][:1]], m, b, s, "u8")
    with pytest.raises(TypeError, match="parts\\[0\\] must be an integer"):
        channel_affine_int([values[0].double()], m, b, s, "u8")
    with pytest.raises(TypeError, match="out must be a Precision"):
        channel_affine_int(values, m, b, s, 8)


class FlatHead(nn.Module):
    """BatchNorm1d on a flattened map (the plan's columns are in NHWC order) and on a
    [N, C, L] tensor (float: its channels are not the last dim of any integer layout)."""

    def __init__(self, three_d: bool) -> None:
        super().__init__()
        self.three_d = three_d
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8 * 6 * 6, 10)
        self.bn, self.bn3 = nn.BatchNorm1d(8 * 6 * 6), nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.conv(x))
        if self.three_d:
            y = F.relu(self.bn3(torch.flatten(y, 2))).reshape(y.shape)
        return self.fc(F.relu(self.bn(torch.flatten(y, 1))))


def test_batchnorm1d_of_a_flattened_map():
    x = _x(8)
    for three_d in (False, True):
        torch.manual_seed(0)
        q = _quantized(FlatHead(three_d), x, "w8a8")
        plan = compiled(q, x).plan
        assert len(plan.steps_of(ChannelAffine)) == 1
        y = ReferenceExecutor(plan)(x)
        with torch.no_grad():
            yf = q(x)
        if three_d:
            assert [fb.reason.startswith("BatchNorm not directly after") for fb in
                    plan.fallbacks if "bn3" in fb.op] == [True]
        else:
            assert not plan.fallbacks, fallback_reasons(plan)
            assert float((y - yf).abs().max()) <= 1e-4 * float(yf.abs().max())


# ------------------------------------------------------------------ sm_90 compile
def _launchers() -> dict:
    """name -> bound ChannelAffine at DenseNet-121 sizes (batch 8), on CPU tensors (device
    checks off; nothing launched): a dense layer's norm1 (six 24-bit parts, u8 out), parts
    of four kinds into bit planes, norm5's wide out."""
    from lowbit.kernels.triton import stored
    from lowbit.kernels.triton.affine import bind_channel_affine

    stored.interpreting = lambda: True
    s16, s24 = WidePrecision(16), WidePrecision(24)

    def empty(c: int, prec, layout: Layout = Layout.INT8, hw: int = 56) -> PackedTensor:
        return stored.empty_packed((8, hw, hw, c), prec, layout, "cpu")

    def bound(parts: list[PackedTensor], out: PackedTensor) -> stored.Launcher:
        c = out.shape[-1]
        return bind_channel_affine(parts, torch.full((c,), -(2**20)), torch.zeros(c, dtype=
                                   torch.int64), torch.full((c,), 30), out, relu=True)

    return {
        "dense_layer_u8": bound([empty(64, s24)] + [empty(32, s24)] * 5, empty(224, "u8")),
        "four_kinds_planes": bound([empty(64, s24), empty(32, "u8"), empty(32, s16),
                                    empty(32, "u2", Layout.BITPLANE)],
                                   empty(160, "u2", Layout.BITPLANE)),
        "norm5_wide": bound([empty(512, s24, hw=7)] + [empty(32, s24, hw=7)] * 16,
                            empty(1024, s24, hw=7)),
    }


@pytest.fixture(scope="module")
def sm90_report() -> dict:
    import os

    import triton

    from triton_offline import run_module_report

    if not os.path.isdir(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                      "bin")):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    return run_module_report(__file__)


def test_affine_launch_compiles_for_sm90_without_spills(sm90_report):
    """Triton's compiler (which the interpreter does not run) accepts the one-launch kernel
    with its address table and kind branches; ptxas fits it without spills."""
    assert set(sm90_report) == {"dense_layer_u8", "four_kinds_planes", "norm5_wide"}
    for name, rows in sm90_report.items():
        assert isinstance(rows, list), rows
        assert [r["kernel"] for r in rows] == ["affine_kernel"], name
        assert rows[0]["spill_bytes"] == 0, (name, rows)


if __name__ == "__main__":
    import json

    from triton_offline import launcher_report

    print(json.dumps(launcher_report(_launchers())))

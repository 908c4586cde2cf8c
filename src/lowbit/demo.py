"""`lowbit demo`: what lowbit does, end to end, in about a minute on a CPU.

A small CNN learns scikit-learn's handwritten digits (8x8 images) in float32. For each
precision (w8a8, w4a4, w2a2, w1a2 by default) a copy is quantization-aware trained (QAT:
`lowbit.quantize` with the first and last layer at 8 bits, then training) and converted to
integer layers (`lowbit.convert`); the demo reports test accuracy against float32 (fake-quant
and integer), and the size of the packed model against float32. Without a GPU the integer
layers run through `lowbit.reference`, the exact CPU oracle the GPU kernels are checked against:
no GPU kernel runs. `engine_section` compiles the last integer model with the network engine
(`lowbit.compile`), names the kernels of its plan and checks the compiled outputs against the
integer model's; on a GPU it also times the compiled model against PyTorch fp16.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

DEMO_PRECISIONS = ("w8a8", "w4a4", "w2a2", "w1a2")
MODEL = "digits_cnn"


@dataclass(frozen=True)
class DemoRow:
    """One precision: test accuracy (fraction) of the fake-quant and the converted integer
    model, packed model bytes, QAT seconds, and the plan's agreement with the integer model."""

    precision: str
    accuracy: float
    integer_accuracy: float
    packed_bytes: int
    seconds: float
    #: images of a test batch whose logits the compiled plan (the exact reference executor)
    #: gives as the integer model run in float64 (to float32's last bit), and the batch size
    plan_equal: tuple[int, int] = (0, 0)


@dataclass
class DemoReport:
    float_accuracy: float
    float_bytes: int
    float_steps: int
    qat_steps: int
    rows: list[DemoRow] = field(default_factory=list)
    gpu: str | None = None          # the GPU's name when the GPU section ran
    gpu_note: str = ""              # what the GPU section did, or why it did not run
    seconds: float = 0.0


def train(model: nn.Module, loader, steps: int, lr: float, cosine: bool = False) -> nn.Module:
    """`steps` Adam steps of cross-entropy over `loader` (cycled), the learning rate annealed
    to 0 on a cosine when `cosine`; returns the model in eval mode."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) if cosine else None
    model.train()
    done = 0
    while done < steps:
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if sched is not None:
                sched.step()
            done += 1
            if done == steps:
                break
    return model.eval()


@torch.no_grad()
def accuracy(model: nn.Module, loader) -> float:
    """Top-1 accuracy (fraction) of `model` in eval mode over `loader`."""
    model.eval()
    right = total = 0
    for x, y in loader:
        right += int((model(x).argmax(1) == y).sum())
        total += len(y)
    return right / total


def float_bytes(model: nn.Module) -> int:
    """float32 bytes of the parameters and the buffers that affect the output."""
    return 4 * sum(t.numel() for n, t in model.state_dict().items()
                   if not n.endswith("num_batches_tracked"))


def packed_bytes(model: nn.Module) -> int:
    """Bytes of a converted model as deployed: each integer layer's weights at their bit width
    (packed), a float32 scale and bias per output channel, every other tensor as float32."""
    from .runtime import integer_modules

    ints = integer_modules(model)
    total = 0
    for m in ints.values():
        total += math.ceil(m.weight.numel() * m.w.bits / 8) + 8 * m.weight.shape[0]
    for name, t in model.state_dict().items():
        owner = name.rpartition(".")[0]
        if owner not in ints and not name.endswith("num_batches_tracked"):
            total += 4 * t.numel()
    return total


def _check_precisions(precisions: tuple[str, ...]) -> list[tuple[int, int]]:
    from .core import parse_wa

    out = []
    for p in precisions:
        out.append(parse_wa(p))
    if not out:
        raise ValueError("give at least one precision, e.g. w4a4")
    return out


def qat(fp32: nn.Module, wb: int, ab: int, loader, steps: int) -> nn.Module:
    """QAT copy of `fp32` at w{wb}a{ab}, first and last layer at w8a8 (the usual choice: they
    are small and the most sensitive)."""
    import lowbit

    names = [n for n, m in fp32.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    edge = dict(weight_bits=8, act_bits=8)
    q = lowbit.quantize(copy.deepcopy(fp32), weight_bits=wb, act_bits=ab, method="max",
                        layers={names[0]: edge, names[-1]: edge})
    return train(q, loader, steps, 1e-3, cosine=True)


def plan_equal(int_model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(images of `x` whose logits `lowbit.compile`'s plan, run by the CPU's exact reference
    executor, gives as the integer model run in float64, len(x)): one integer semantics,
    checked at every precision. Equal integers everywhere leave only the last affine map's
    float rounding: logits agree to 2^-22 of the largest."""
    from .runtime.compiled import compile_model

    model = copy.deepcopy(int_model).cpu()
    x = x.cpu()
    compiled = compile_model(model, x, executor="reference", records=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = compiled(x)
        want = model.double()(x.double()).float()
    tol = 2.0**-22 * float(want.abs().max())
    return int(((got - want).abs() <= tol).all(dim=1).sum()), len(x)


def engine_section(int_model: nn.Module, fp32: nn.Module, example: torch.Tensor, label: str,
                   device: torch.device | str | None = None) -> tuple[str | None, str]:
    """Compile the integer model with the network engine (`lowbit.compile`) on `device`
    (default: the GPU when there is one, else the CPU), check that the compiled model gives the
    integer model's outputs, and on a GPU time it against PyTorch fp16 (CUDA events, median).
    Returns (GPU name or None, what happened in words: the kernels of the plan, the agreement,
    the times)."""
    from collections import Counter

    from .graph.ir import Layer
    from .runtime.compiled import compile_model

    device = torch.device(device if device is not None else
                          "cuda" if torch.cuda.is_available() else "cpu")
    x = example.to(device)
    model = copy.deepcopy(int_model).to(device)
    compiled = compile_model(model, x)
    impls = Counter(s.impl for s in compiled.plan.steps if isinstance(s, Layer))
    kernels = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in impls.items())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU's reference executor
        got, want = compiled(x), model(x)
    same = int((got.argmax(1) == want.argmax(1)).sum())
    diff = float((got.float() - want.float()).abs().max()) if got.numel() else 0.0
    agree = (f"{same} of {len(x)} predictions equal to the integer model's (largest logit "
             f"difference {diff:.3g})")
    if device.type != "cuda":
        return None, (f"no CUDA GPU here, so no GPU kernel ran: lowbit.compile planned the "
                      f"{label} model for {kernels} and ran the plan through the exact "
                      f"reference executor: {agree}")
    from .kernels.timing import time_us

    ours = time_us(lambda: compiled(x), device="cuda")
    half = copy.deepcopy(fp32).to(device).half().to(memory_format=torch.channels_last)
    xh = x.half().to(memory_format=torch.channels_last)
    with torch.no_grad():
        base = time_us(lambda: half(xh), device="cuda")
    return torch.cuda.get_device_name(device), (
        f"compiled the {label} model with lowbit.compile ({kernels}): {ours:.1f} us per "
        f"batch of {len(x)} against {base:.1f} us for PyTorch fp16 ({base / ours:.2f}x); "
        f"{agree}")


def run_demo(float_steps: int = 200, qat_steps: int = 100,
             precisions: tuple[str, ...] = DEMO_PRECISIONS, seed: int = 0,
             progress=None) -> DemoReport:
    """Train, quantize, convert and measure (module doc). `progress(text)` is called as each
    stage finishes."""
    from . import models
    from .quant.data import digits_loaders
    from .runtime import convert

    t0 = time.perf_counter()
    bits = _check_precisions(precisions)
    say = progress or (lambda text: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny layers: one thread is fastest, and far faster under load
    try:
        train_loader, test = digits_loaders(batch_size=64, seed=seed)
        torch.manual_seed(seed)
        fp32 = train(models.get(MODEL, num_classes=10), train_loader, float_steps, 3e-3,
                     cosine=True)
        report = DemoReport(accuracy(fp32, test), float_bytes(fp32), float_steps, qat_steps)
        say(f"float32: {report.float_accuracy:.1%} test accuracy after {float_steps} steps")
        int_model = None
        for p, (wb, ab) in zip(precisions, bits, strict=True):
            t = time.perf_counter()
            torch.manual_seed(seed + 1)
            q = qat(fp32, wb, ab, train_loader, qat_steps)
            int_model = convert(q)
            row = DemoRow(p, accuracy(q, test), accuracy(int_model, test),
                          packed_bytes(int_model), time.perf_counter() - t,
                          plan_equal(int_model, next(iter(test))[0]))
            report.rows.append(row)
            say(f"{p}: {row.accuracy:.1%} (integer {row.integer_accuracy:.1%}), "
                f"{row.packed_bytes:,} bytes, compiled plan = integer model on "
                f"{row.plan_equal[0]} of {row.plan_equal[1]} images")
        report.gpu, report.gpu_note = engine_section(int_model, fp32, next(iter(test))[0],
                                                     precisions[-1])
    finally:
        torch.set_num_threads(threads)
    report.seconds = time.perf_counter() - t0
    return report

"""From Brevitas to lowbit's kernels through ONNX Q/DQ: a Brevitas-trained w2a2 digits CNN,
exported with Brevitas's QCDQ ONNX export, read by `lowbit.from_onnx` and compiled by
`lowbit.compile`, against Brevitas's own forward (the done-when of `lowbit.from_onnx`: the
same predictions on at least 99.5% of the test images).

Model (Brevitas layers, trained from scratch with QAT on scikit-learn's digits, CPU): an
8-bit signed input quantizer (QuantIdentity), the digits CNN's four 3x3 convs (16, 32 /2,
32, 64 /2 channels) with BatchNorm and 2-bit QuantReLU, weights per output channel at 8 bits
for the first conv and 2 bits for the others, flatten, an 8-bit linear classifier: every
layer's input is a 2-bit activation except the first's. Rows: the agreement of the imported
fake-quant model and of the compiled model (reference executor on the CPU, GPU executor on a
GPU) with Brevitas's predictions on the test split, the accuracies, the largest logit
differences. On a GPU also the time of the compiled model against the same float model in
PyTorch fp16 (eager, CUDA graph, `torch.compile`) per batch. Writes
benchmarks/results/<gpu>/onnx_bridge-<stamp>.json.

    python benchmarks/onnx_bridge.py [--epochs 10] [--exporter dynamo|torchscript]
        [--batches 256,4096] [--compile-mode default]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import warnings
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lowbit
from common import write_results
from lowbit.quant.data import digits_loaders
from lowbit.quant.modules import QuantConv2d, QuantLinear
from lowbit.quant.qdq_modules import StandaloneQuant

TARGET_AGREEMENT = 0.995
WIDTHS = (16, 32, 32, 64)
STRIDES = (1, 2, 1, 2)


def brevitas_cnn(num_classes: int = 10) -> nn.Module:
    """The module docstring's Brevitas model."""
    import brevitas.nn as qnn
    from brevitas.quant import Int8WeightPerChannelFloat

    layers: dict[str, nn.Module] = {"input_quant": qnn.QuantIdentity(bit_width=8)}
    c_in = 1
    for i, (c, s) in enumerate(zip(WIDTHS, STRIDES, strict=True)):
        layers[f"conv{i + 1}"] = qnn.QuantConv2d(
            c_in, c, 3, s, 1, bias=False, weight_bit_width=8 if i == 0 else 2,
            weight_quant=Int8WeightPerChannelFloat)
        layers[f"bn{i + 1}"] = nn.BatchNorm2d(c)
        layers[f"relu{i + 1}"] = qnn.QuantReLU(bit_width=2)
        c_in = c
    layers["flatten"] = nn.Flatten()
    layers["fc"] = qnn.QuantLinear(c_in * 2 * 2, num_classes, bias=True, weight_bit_width=8,
                                   weight_quant=Int8WeightPerChannelFloat)
    return nn.Sequential(OrderedDict(layers))


def train(model: nn.Module, loader, epochs: int, lr: float) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * len(loader))
    model.train()
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
    model.eval()


def float_twin(model: nn.Module) -> nn.Module:
    """`model` (from from_onnx) with every quantizer removed: the same float network."""
    twin = copy.deepcopy(model)
    for name, m in list(twin.named_modules()):
        if isinstance(m, QuantConv2d):
            new: nn.Module = nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride,
                                       m.padding, m.dilation, m.groups, m.bias is not None)
        elif isinstance(m, QuantLinear):
            new = nn.Linear(m.in_features, m.out_features, m.bias is not None)
        elif isinstance(m, StandaloneQuant):
            new = nn.Identity()
        else:
            continue
        new.load_state_dict(m.state_dict(), strict=False)
        parent, _, child = name.rpartition(".")
        setattr(twin.get_submodule(parent) if parent else twin, child, new)
    return twin.eval()


def agreement_row(brevitas: nn.Module, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                  device: torch.device) -> dict:
    """Brevitas's forward, the imported fake-quant model and the compiled model on (x, y)."""
    with torch.no_grad():
        theirs = brevitas(x)
        fake = model(x)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        compiled = lowbit.compile(model, x.to(device))
        out = compiled(x.to(device)).float().cpu()
    seconds = time.perf_counter() - t0
    top = theirs.argmax(1)
    plan = compiled.plan
    return {"kind": "agreement", "images": len(y), "executor": compiled.executor,
            "brevitas_accuracy": float((top == y).float().mean()),
            "fake_quant_accuracy": float((fake.argmax(1) == y).float().mean()),
            "compiled_accuracy": float((out.argmax(1) == y).float().mean()),
            "fake_quant_agreement": float((fake.argmax(1) == top).float().mean()),
            "compiled_agreement": float((out.argmax(1) == top).float().mean()),
            "fake_quant_max_logit_diff": float((fake - theirs).abs().max()),
            "compiled_max_logit_diff": float((out - theirs).abs().max()),
            "compile_and_run_s": round(seconds, 2),
            "layers": [{"name": s.name, "impl": s.impl,
                        "precision": f"{s.workload.w}/{s.workload.a}"} for s in plan.layers],
            "float_fallbacks": len(plan.fallbacks)}


def time_rows(model: nn.Module, x: torch.Tensor, batches: list[int], compile_mode: str
              ) -> list[dict]:
    """GPU: the compiled model's forward (its CUDA graph) against the float twin in fp16."""
    from lowbit.bench import fp16_baselines
    from lowbit.kernels.timing import time_us
    from lowbit.runtime.gpu import GpuExecutor

    device = torch.device("cuda")
    twin = float_twin(model).to(device)
    rows = []
    for b in batches:
        xb = x.repeat((b + len(x) - 1) // len(x), 1, 1, 1)[:b].to(device)
        cm = lowbit.compile(model, xb)
        ex = GpuExecutor(cm.plan, device)
        ex(xb)
        torch.cuda.synchronize()
        lowbit_ms = time_us(ex.replay, warmup_ms=25, rep_ms=300) / 1e3
        base, notes = fp16_baselines(twin, xb, compile_mode)
        notes.pop("fp16_modules_us", None)
        best = base.get("fp16_compile")
        rows.append({"kind": "time", "batch": b, "lowbit_ms": lowbit_ms,
                     "images_per_s": b / (lowbit_ms / 1e3), "baselines_ms": base,
                     "speedup_vs_fp16_compile": None if not best else best / lowbit_ms,
                     "notes": notes})
    return rows


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo",
                    help="Brevitas's exporter (dynamo: its default with torch >= 2.9)")
    ap.add_argument("--batches", default="256,4096", help="GPU timing batches")
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode of fp16")
    args = ap.parse_args(argv)
    import brevitas
    import onnx
    from brevitas.export import export_onnx_qcdq

    torch.manual_seed(args.seed)
    train_loader, test_loader = digits_loaders(seed=args.seed)
    brevitas_model = brevitas_cnn()
    t0 = time.perf_counter()
    train(brevitas_model, train_loader, args.epochs, args.lr)
    train_s = time.perf_counter() - t0
    x, y = (torch.cat(t) for t in zip(*test_loader, strict=True))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "digits_w2a2.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            export_onnx_qcdq(brevitas_model, args=x[:2], export_path=str(path),
                             dynamo=args.exporter == "dynamo")
        proto = onnx.load(str(path))
        model = lowbit.from_onnx(proto)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    row = agreement_row(brevitas_model, model, x, y, device)
    row["onnx_ops"] = sorted({n.op_type for n in proto.graph.node})
    rows = [row]
    if cuda:
        rows += time_rows(model, x, [int(b) for b in args.batches.split(",")],
                          args.compile_mode)
    timed = [r for r in rows if r["kind"] == "time"]
    targets = {"compiled_agreement>=99.5%": row["compiled_agreement"] >= TARGET_AGREEMENT}
    if timed:
        targets["faster_than_fp16_torch_compile"] = all(
            (r["speedup_vs_fp16_compile"] or 0) > 1 for r in timed)
    setup = {"dataset": "digits", "model": "Brevitas digits CNN (w2a2; first conv w8, "
             "classifier w8, input a8)", "epochs": args.epochs, "lr": args.lr,
             "seed": args.seed, "exporter": args.exporter, "train_s": round(train_s, 1),
             "brevitas": brevitas.__version__, "onnx": onnx.__version__,
             "compile_mode": args.compile_mode if cuda else None}
    out = write_results("onnx_bridge", rows, {"setup": setup, "targets": targets})
    print(f"agreement with Brevitas: fake-quant {100 * row['fake_quant_agreement']:.2f}%, "
          f"compiled ({row['executor']}) {100 * row['compiled_agreement']:.2f}% of "
          f"{row['images']} test images; accuracy Brevitas "
          f"{100 * row['brevitas_accuracy']:.2f}%, compiled {100 * row['compiled_accuracy']:.2f}%")
    for r in timed:
        print(f"batch {r['batch']}: lowbit {r['lowbit_ms']:.4f} ms, fp16 "
              f"torch.compile {r['baselines_ms'].get('fp16_compile')} ms")
    print(f"targets: {targets}\nwrote {out}")
    return out


if __name__ == "__main__":
    main()

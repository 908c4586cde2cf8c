"""Where a forward call's host time goes (GPU): the compiled executor's input copy, CUDA-graph
replay and output clone, timed on the host under several call patterns.

Patterns (each a median or mean of host seconds per call, microseconds):
- `back_to_back_N`: N calls in a row after a long sleep kernel (the network bench's method,
  N = 50): later calls may block once the launch queue fills behind the sleeping GPU;
- `isolated`: each call alone behind a ~8 ms sleep kernel, synchronized after (a serving
  loop that reads every result);
- `parts`: copy_, graph replay and clone each timed alone that way.
Each row also counts the forward's launches (the graph's kernel nodes, about).

    python benchmarks/probes/host_probe.py    # rows to $OUT/host_probe.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_probe
from lowbit.bench import build_quantized, compile_plan, random_images
from lowbit.runtime.gpu import GpuExecutor

CASES = [("resnet18", "w1a2", 8), ("vgg16", "w1a2", 8), ("resnet50", "w1a2", 256)]
SLEEP_CYCLES = int(1.5e7)


def back_to_back_us(fn, calls: int) -> float:
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(200 * 1.5e6))
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    return dt * 1e6


def isolated_us(fn, calls: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        torch.cuda._sleep(SLEEP_CYCLES)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def probe(model: str, recipe: str, batch: int) -> dict:
    q, _ = build_quantized(model, recipe, image_size=224, device="cuda")
    x = random_images(batch, 224, device="cuda")
    plan, _ = compile_plan(q, x)
    ex = GpuExecutor(plan, "cuda")
    ex.check_finite = False
    ex(x)
    inp = ex.buffers[plan.input]
    row = {"model": model, "recipe": recipe, "batch": batch,
           "launches": sum(len(b.launches) for b in ex.steps if not b.record_only)}
    call = lambda: ex(x)  # noqa: E731
    for n in (5, 10, 50):
        row[f"back_to_back_{n}_us"] = back_to_back_us(call, n)
    row["isolated_us"] = isolated_us(call)
    row["parts_isolated_us"] = {"copy": isolated_us(lambda: inp.copy_(x)),
                                "replay": isolated_us(ex.graph.replay),
                                "clone": isolated_us(lambda: ex.result.clone()),
                                "check_input": isolated_us(lambda: ex.check_input(x))}
    row["parts_back_to_back_10_us"] = {"copy": back_to_back_us(lambda: inp.copy_(x), 10),
                                       "replay": back_to_back_us(ex.graph.replay, 10),
                                       "clone": back_to_back_us(lambda: ex.result.clone(), 10)}
    return row


def main() -> None:
    rows = []
    for case in CASES:
        try:
            rows.append(probe(*case))
        except Exception as e:  # one case failing must not lose the others
            rows.append({"model": case[0], "error": f"{type(e).__name__}: {e}"})
        print(rows[-1], flush=True)
    print(write_probe("host_probe", rows))


if __name__ == "__main__":
    main()

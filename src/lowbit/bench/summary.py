"""The network rows in words and pictures: `summary_table` (one line per row, against the
fp16 baselines and TensorRT's cited throughput) and `per_layer_figure` (where the time goes per
step, next to fp16 eager per module)."""

from __future__ import annotations

#: TensorRT int8 ResNet-50 in MLPerf Inference v4.0 (Offline), one H100 SXM: the deploying
#: user's reference (cited: it cannot run here), images per second
TENSORRT_INT8_RESNET50_IMAGES_S = 88_714


def summary_table(rows: list[dict]) -> str:
    """A short text table of the rows, TensorRT's cited throughput last."""
    lines = [f"{'model':<10} {'b':>4} {'prec':<10} {'ms':>8} {'img/s':>9} {'eager':>7} "
             f"{'graph':>7} {'compile':>7} {'x graph':>7} {'x comp':>7} {'floor':>7}  note"]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['model']:<10} {r['batch']:>4} {r['precision']:<6} error: "
                         f"{r['error'][:80]}")
            continue
        b = r["baselines_ms"]

        def f(v: float | None) -> str:
            return f"{v:7.3f}" if v else "      -"

        x = b.get("fp16_cuda_graph") / r["time_ms"] if b.get("fp16_cuda_graph") else None
        xc = b.get("fp16_compile") / r["time_ms"] if b.get("fp16_compile") else None
        prec = r["precision"] + ("" if r.get("wide_bits", 24) == 24 else f"/{r['wide_bits']}") \
            + (f"/res{r['residual_bits']}" if r.get("residual_bits") else "")
        lines.append(f"{r['model']:<10} {r['batch']:>4} {prec:<10} "
                     f"{r['time_ms']:8.3f} {r['images_per_s']:9.0f} {f(b.get('fp16_eager'))} "
                     f"{f(b.get('fp16_cuda_graph'))} {f(b.get('fp16_compile'))} "
                     f"{(f'{x:6.2f}x') if x else '      -'} "
                     f"{(f'{xc:6.2f}x') if xc else '      -'} {r['floor_ms']:7.3f}  "
                     f"host {r['host_overhead_us']:.1f} us"
                     + (f" (bound {r['host_overhead_bound_us']:.1f})"
                        if r.get("host_overhead_bound_us") else "")
                     + ("" if r.get("top1_equal", True) else "  TOP-1 MISMATCH"))
    lines.append(f"{'TensorRT int8 (MLPerf v4.0, one H100, cited)':<40} resnet50 b256 "
                 f"{256e3 / TENSORRT_INT8_RESNET50_IMAGES_S:8.3f} ms "
                 f"{TENSORRT_INT8_RESNET50_IMAGES_S:9,} images/s")
    return "\n".join(lines)


def per_layer_figure(row: dict, path: str) -> str | None:
    """Bar chart of where the time goes per step (ours) next to fp16 eager per module; None
    when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    layers = row["layers"]
    n = len(layers)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.28 * n), 4.0))
    xs = range(n)
    ax.bar([i - 0.2 for i in xs], [r["time_us"] for r in layers], 0.4, label="lowbit")
    ax.bar([i + 0.2 for i in xs], [r.get("fp16_us") or 0 for r in layers], 0.4,
           label="PyTorch fp16 eager (module)")
    ax.plot(list(xs), [r["floor_us"] for r in layers], "k_", markersize=8, label="floor")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["name"].split(".", 1)[-1][:18] for r in layers], rotation=90,
                       fontsize=6)
    ax.set_ylabel("us")
    title = f"{row['model']} b{row['batch']} {row['precision']}: {row['time_ms']:.3f} ms"
    title += f" (floor sum {row['floor_ms']:.3f} ms"
    if row["model"] == "resnet50":  # the whole network's time per step against TensorRT's
        trt_ms = row["batch"] * 1e3 / TENSORRT_INT8_RESNET50_IMAGES_S
        ax.axhline(trt_ms * 1e3 / max(n, 1), color="r", linestyle="--", linewidth=0.8,
                   label=f"TensorRT int8 (cited), {trt_ms:.3f} ms / {n} steps")
        title += f"; TensorRT int8 {trt_ms:.3f} ms"
    ax.set_title(title + ")")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""`lowbit bench` and `lowbit tune --model` on a CPU: the errors a user meets before any GPU
work, and the network's layer workloads that `tune --model` tunes."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from lowbit.bench import network_workloads
from lowbit.cli import ENVIRONMENT_ERROR, USER_ERROR, app
from lowbit.core import ConvWorkload, GemmWorkload


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_bench_unknown_model_is_one_user_error():
    r = _run("bench", "resnet1000")
    assert r.exit_code == USER_ERROR
    assert "model must be one of" in r.output and "resnet18" in r.output
    assert "Traceback" not in r.output


def test_bench_unknown_policy_is_one_user_error():
    r = _run("bench", "resnet18", "--policy", "fastest")
    assert r.exit_code == USER_ERROR
    assert "--policy must be" in r.output and "triton.conv2d_int8" in r.output
    assert "Traceback" not in r.output


def test_bench_without_gpu_is_an_environment_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = _run("bench", "resnet18", "--batch", "2")
    assert r.exit_code == ENVIRONMENT_ERROR
    assert "needs a CUDA GPU" in r.output


def test_network_workloads_are_the_plans_distinct_layers():
    layers = network_workloads("digits_cnn", 3, "w2a2")
    keys = [wl.key for _, wl in layers]
    assert len(keys) == len(set(keys)) >= 3
    convs = [wl for _, wl in layers if isinstance(wl, ConvWorkload)]
    gemms = [wl for _, wl in layers if isinstance(wl, GemmWorkload)]
    assert convs and gemms
    assert all(wl.N == 3 for wl in convs) and all(wl.M == 3 for wl in gemms)
    # the recipe: first conv and classifier at 8 bits, the rest at w2a2 on bit planes
    assert (convs[0].w.bits, convs[0].a.bits) == (8, 8)
    assert (gemms[-1].w.bits, gemms[-1].a.bits) == (8, 8)
    middle = convs[1:]
    assert middle and all((wl.w.bits, wl.a.bits) == (2, 2) for wl in middle)
    assert all(wl.a_layout.value == "bitplane" for wl in middle)


def test_tune_model_rejects_unknown_network():
    r = _run("tune", "--model", "nonet", "--trials", "1")
    assert r.exit_code == USER_ERROR
    assert "--model must be one of" in r.output


def test_int8_preferring_puts_the_template_first_where_it_runs_the_layer():
    from lowbit.graph import choose_impl, int8_preferring
    from lowbit.graph.impl import INT8_CONV

    layers = network_workloads("digits_cnn", 3, "w8a8-all")
    convs = [wl for _, wl in layers if isinstance(wl, ConvWorkload)]
    assert convs
    checked = 0
    for name in INT8_CONV:
        prefer = int8_preferring(name)
        for wl in convs:
            impl, why = prefer(wl)
            default = choose_impl(wl)[0]
            # the preferred template where it runs the layer, else the default's choice
            from lowbit.graph.impl import unsupported_reason
            assert impl == (name if unsupported_reason(name, wl) is None else default), why
            checked += 1
    assert checked == len(INT8_CONV) * len(convs)
    try:
        int8_preferring("cuda.bitserial")
    except ValueError as e:
        assert "template must be one of" in str(e)
    else:
        raise AssertionError("a non-int8 template was accepted")


def test_network_case_parses_the_implementation_policy():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import argparse

    from network import parse_case

    assert parse_case("resnet50:256:w8a8").chooser == "default"
    assert parse_case("resnet50:256:w8a8:model").chooser == "model"
    case = parse_case("resnet50:256:w8a8:wide16:int8=triton.conv2d_int8_tma")
    assert (case.chooser, case.wide_bits) == ("triton.conv2d_int8_tma", 16)
    assert case.fuse_outputs and not parse_case("resnet50:8:w8a8:nofuse").fuse_outputs
    assert not case.requant32 and parse_case("resnet50:256:w1a2:res8:approx").requant32
    assert parse_case("resnet50:256:w1a2:res8:stem=ws").stem_kernel == "ws"
    assert case.stem_kernel is None
    grouped = parse_case("tv:resnext50_32x4d:32:w2a2:res8:int8=triton.conv2d_grouped_cuda")
    assert (grouped.model, grouped.chooser) == ("tv:resnext50_32x4d",
                                                "triton.conv2d_grouped_cuda")
    for bad in ("resnet50:256:w8a8:int8=nope", "resnet50:256:w8a8:model:int8=triton.gemm_int8"):
        try:
            parse_case(bad)
        except argparse.ArgumentTypeError as e:
            assert "MODEL:BATCH:PRECISION" in str(e)
        else:
            raise AssertionError(f"{bad} was accepted")

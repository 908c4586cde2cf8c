"""Shared helpers of the any-CNN tests: quantize + calibrate + compile a model, and check that
every integer layer of the plan reads exactly what the fake-quant model's own input quantizer
gives it."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import lowbit
from engine_cases import layer_names, randomize_batchnorms
from lowbit.graph import Plan
from lowbit.runtime.compiled import CompiledModel, compile_model
from lowbit.runtime.engine import ReferenceExecutor


def quantized(model: nn.Module, x: torch.Tensor, recipe: str = "w8a8", seed: int = 0,
              **kw) -> nn.Module:
    """`model` (BatchNorms randomized) quantized by a recipe 'wXaY' (first and last layer at
    w8a8) and calibrated on x."""
    model = model.eval()
    randomize_batchnorms(model, seed)
    w, a = int(recipe[1]), int(recipe[3])
    names = layer_names(model)
    eight = {"weight_bits": 8, "act_bits": 8}
    layers = {names[0]: eight, names[-1]: eight} if (w, a) != (8, 8) and len(names) > 1 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = lowbit.quantize(model, weight_bits=w, act_bits=a, layers=layers, **kw)
    lowbit.calibrate(q, [x])
    return q.eval()


def compiled(q: nn.Module, x: torch.Tensor, **kw) -> CompiledModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return compile_model(q, x, executor="reference", records=False, **kw)


def layer_inputs_exact(q: nn.Module, plan: Plan, x: torch.Tensor
                       ) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Assert that every integer layer's input tensor holds exactly the values of the
    fake-quant layer's input quantizer (q / scale); returns (how many layers were checked,
    the plan's output, the fake-quant model's output)."""
    inputs = {}
    hooks = [m.act_quant.register_forward_hook(
        lambda mod, i, o, n=name: inputs.__setitem__(n, o))
        for name, m in lowbit.quant.quant_layers(q)]
    try:
        with torch.no_grad():
            y_model = q(x)
    finally:
        for h in hooks:
            h.remove()
    y_plan, rec = ReferenceExecutor(plan)(x, record=True)
    checked = 0
    for s in plan.layers:
        src = s.source[0]
        if src not in inputs or s.input not in rec:
            continue
        spec = plan.tensors[s.input]
        have = lowbit.quant.unpack(rec[s.input], spec.precision, spec.layout, spec.shape[-1])
        want = (inputs[src].double() / spec.scale).round()
        want = want.permute(0, 2, 3, 1) if want.dim() == 4 else want
        assert torch.equal(have.double(), want), s.name
        checked += 1
    return checked, y_plan, y_model


def fallback_reasons(plan: Plan) -> dict[str, str]:
    """{fallback step: its reason}."""
    return {s.name: s.reason for s in plan.fallbacks}

"""The compiled-network model kind: a `lowbit.compile` result saved as its plans.

Each plan the compiled model holds (one per input shape it ran) is stored as its JSON manifest
(`Plan.to_dict`: tensors, steps, implementations, realizations and their scales) and its
numeric parameters (integer weights, multipliers, shifts, biases) as tensors under
`plan<i>.<key>`. Loading gives a `CompiledModel` that runs exactly those plans (the GPU
executor on a CUDA device, the reference otherwise), bit-identical to the saved one; inputs of
other shapes need the source model compiled again. Plans with FloatFallback steps hold PyTorch
modules of the source model, which a tensor file does not describe: saving them raises, and
the source model itself saves with `lowbit.save`.
"""

from __future__ import annotations

from torch import nn

from ..graph.ir import Plan
from ..runtime.compiled import CompiledModel
from .registry import ModelKind, Tensors, register_kind


def _compiled_to(model: CompiledModel) -> tuple[dict, Tensors]:
    plans = model.plans
    fallbacks = sorted({s.name for p in plans for s in p.fallbacks})
    if fallbacks:
        raise ValueError(f"this compiled model has float fallback steps ({', '.join(fallbacks)})"
                         ", whose PyTorch modules a saved plan cannot hold: save the source "
                         "model with lowbit.save and compile it again after loading")
    tensors: Tensors = {}
    for i, plan in enumerate(plans):
        for key, t in plan.params.items():
            tensors[f"plan{i}.{key}"] = t.detach().cpu().contiguous().clone()
    return {"plans": [p.to_dict() for p in plans], "executor": model.executor,
            "wide_bits": model.wide_bits}, tensors


def _compiled_from(manifest: dict, tensors: Tensors, base: nn.Module | None) -> nn.Module:
    plans = []
    for i, d in enumerate(manifest["plans"]):
        prefix = f"plan{i}."
        params = {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}
        plans.append(Plan.from_dict(d, params))
    if not plans:
        raise ValueError("the saved compiled model holds no plan")
    model = CompiledModel.from_plan(plans[0])
    for plan in plans[1:]:
        model.add_plan(plan)
    model.wide_bits = int(manifest.get("wide_bits", model.wide_bits))
    return model


def _compiled_precisions(manifest: dict) -> dict[str, str]:
    """Each plan layer's integer weight tensor and its workload's weight precision."""
    return {f"plan{i}.{step['weight']}": step["workload"]["w"]
            for i, plan in enumerate(manifest["plans"]) for step in plan["steps"]
            if step.get("kind") == "layer" and step.get("weight")}


def _is_compiled(model: nn.Module) -> bool:
    return isinstance(model, CompiledModel)


COMPILED = register_kind(ModelKind("compiled", _is_compiled, _compiled_to, _compiled_from,
                                   _compiled_precisions))

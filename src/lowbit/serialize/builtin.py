"""The two built-in model kinds: fake-quant (QAT / calibrated) and converted (integer) models.

Both save the whole state_dict (every buffer that affects outputs: observer ranges and
histograms, Rand's p, the frozen flag, the mix state, integer weights and scales) and a
manifest of what the state_dict cannot say: each layer's recipe or integer spec, the float
layers' reasons and the mix histories. Loading rebuilds the modules on a fresh float model of
the same architecture, then loads the state_dict strictly.
"""

from __future__ import annotations

from torch import nn

from ..core import Precision
from ..quant.api import FLOAT_REASON, candidate_layers, quant_layers
from ..quant.convert import IntegerLayer
from ..quant.recipe import LayerRecipe, build_quant_layer, recipe_of
from ..quant.residual import attach_residual, residual_recipes
from ..runtime.integer_model import IntegerConv2d, IntegerLinear, integer_modules
from .registry import ModelKind, Tensors, register_kind


def state_tensors(model: nn.Module) -> Tensors:
    """The state_dict as independent contiguous CPU tensors (safetensors refuses shared
    storage)."""
    return {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}


def _float_reasons(model: nn.Module) -> dict[str, str]:
    return {n: getattr(m, FLOAT_REASON) for n, m in candidate_layers(model)
            if hasattr(m, FLOAT_REASON)}


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _layer(base: nn.Module, name: str, kinds: tuple[type, ...]) -> nn.Module:
    try:
        layer = base.get_submodule(name)
    except AttributeError:
        layer = None
    if not isinstance(layer, kinds):
        names = ", ".join(n for n, _ in candidate_layers(base)) or "none"
        raise ValueError(f"the model's architecture does not match the saved one: it has no "
                         f"{'/'.join(k.__name__ for k in kinds)} layer {name} (its layers: "
                         f"{names})")
    return layer


def _need_base(base: nn.Module | None) -> nn.Module:
    if base is None:
        raise ValueError("the file does not name its architecture: pass model= (a fresh float "
                         "model of the saved architecture, or a function returning one), or "
                         "save with arch='package.module:function'")
    return base


def _finish(model: nn.Module, manifest: dict, tensors: Tensors) -> nn.Module:
    for name, why in manifest.get("float_layers", {}).items():
        try:
            setattr(model.get_submodule(name), FLOAT_REASON, why)
        except AttributeError:
            pass
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError("the model's architecture does not match the saved one: "
                         f"missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}")
    return model.train(bool(manifest.get("training", False)))


# ------------------------------------------------------------------ fake-quant

def _fakequant_to(model: nn.Module) -> tuple[dict, Tensors]:
    layers = []
    for name, layer in quant_layers(model):
        mix = layer.act_quant.mix
        layers.append({"name": name, "type": type(layer).__name__,
                       "recipe": recipe_of(layer).to_dict(),
                       "mix_history": [list(h) for h in mix.history] if mix else None})
    return ({"layers": layers, "float_layers": _float_reasons(model),
             "residual": residual_recipes(model), "training": model.training},
            state_tensors(model))


def _fakequant_from(manifest: dict, tensors: Tensors, base: nn.Module | None) -> nn.Module:
    model = _need_base(base)
    for row in manifest["layers"]:
        kinds = (nn.Conv2d,) if row["type"] == "QuantConv2d" else (nn.Linear,)
        layer = _layer(model, row["name"], kinds)
        q = build_quant_layer(layer, row["name"], LayerRecipe.from_dict(row["recipe"]))
        if row["mix_history"] is not None:
            q.act_quant.mix.history = [tuple(h) for h in row["mix_history"]]
        _set_module(model, row["name"], q)
    attach_residual(model, manifest.get("residual", {}))
    return _finish(model, manifest, tensors)


# ------------------------------------------------------------------ converted

def _converted_to(model: nn.Module) -> tuple[dict, Tensors]:
    layers = [{"name": name, "kind": m.kind, "w": str(m.w), "a": str(m.a), "stride": m.stride,
               "pad": m.pad, "groups": m.groups, "folded_bn": m.folded_bn_name,
               "nonfinite": m.nonfinite}
              for name, m in integer_modules(model).items()]
    return ({"layers": layers, "float_layers": _float_reasons(model),
             "residual": residual_recipes(model), "training": False}, state_tensors(model))


def _converted_from(manifest: dict, tensors: Tensors, base: nn.Module | None) -> nn.Module:
    model = _need_base(base)
    for row in manifest["layers"]:
        name, conv = row["name"], row["kind"] == "conv2d"
        _layer(model, name, (nn.Conv2d,) if conv else (nn.Linear,))
        t = {k: tensors[f"{name}.{k}"] for k in ("weight", "w_scale", "out_scale", "out_bias")}
        spec = IntegerLayer(row["kind"], t["weight"], Precision.parse(row["w"]),
                            Precision.parse(row["a"]), float(tensors[f"{name}.a_scale"]),
                            t["w_scale"], t["out_scale"], t["out_bias"], row["stride"],
                            row["pad"], row["folded_bn"] is not None, row.get("groups", 1))
        cls = IntegerConv2d if conv else IntegerLinear
        _set_module(model, name, cls(spec, name, row["nonfinite"], row["folded_bn"]))
        if row["folded_bn"] is not None:
            _set_module(model, row["folded_bn"], nn.Identity())
    attach_residual(model, manifest.get("residual", {}))
    return _finish(model, manifest, tensors).eval()


def _converted_precisions(manifest: dict) -> dict[str, str]:
    """Each integer layer's weight tensor and its declared weight precision."""
    return {f"{row['name']}.weight": row["w"] for row in manifest["layers"]}


FAKEQUANT = register_kind(ModelKind("fakequant", lambda m: bool(quant_layers(m)),
                                    _fakequant_to, _fakequant_from))
CONVERTED = register_kind(ModelKind("converted", lambda m: bool(integer_modules(m)),
                                    _converted_to, _converted_from, _converted_precisions))

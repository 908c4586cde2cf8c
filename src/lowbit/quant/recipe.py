"""One layer's quantization recipe: everything needed to rebuild its fake-quant module from the
float layer (its learned and observed state then comes from the state_dict).

`lowbit.quantize` builds layers from recipes, and `lowbit.save` writes each layer's recipe
into the manifest so that `lowbit.load` can rebuild the same modules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from torch import nn

from .learned import LEARNED_METHODS, learned_layer
from .modules import ActQuantizer, QuantConv2d, QuantLinear, WeightQuantizer
from .precision_mix import AdaptivePrecision


@dataclass(frozen=True)
class MixRecipe:
    """Adaptive training precision (precision_mix.py): start bits, beta, end of warm-up."""

    beta: float = 4.0
    until: int | None = None
    start: int = 32


@dataclass(frozen=True)
class LayerRecipe:
    """Precision, clip method and observer options of one quantized Conv2d / Linear."""

    weight_bits: int
    act_bits: int
    method: str = "max"
    mix: MixRecipe | None = None
    nonfinite: str = "raise"
    threshold: float = 1e-5
    percentile: float = 99.99
    observer: dict = field(default_factory=dict)  # bins, momentum, tau, eta

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LayerRecipe:
        d = dict(d)
        mix = d.pop("mix", None)
        return cls(**d, mix=MixRecipe(**mix) if mix is not None else None)


def build_quant_layer(layer: nn.Module, name: str, recipe: LayerRecipe) -> nn.Module:
    """Fake-quant copy of the float Conv2d / Linear `layer` (named `name` in its model)."""
    mix = None
    if recipe.mix is not None:
        mix = AdaptivePrecision(recipe.act_bits, start_bits=recipe.mix.start,
                                beta=recipe.mix.beta, until=recipe.mix.until)
    if recipe.method in LEARNED_METHODS:
        return learned_layer(layer, name, recipe, mix)
    act = ActQuantizer(recipe.act_bits, recipe.method, mix=mix, threshold=recipe.threshold,
                       percentile=recipe.percentile, layer_name=name,
                       nonfinite=recipe.nonfinite, **recipe.observer)
    wq = WeightQuantizer(recipe.weight_bits, recipe.method, threshold=recipe.threshold,
                         percentile=recipe.percentile, layer_name=name)
    cls = QuantConv2d if isinstance(layer, nn.Conv2d) else QuantLinear
    return cls.from_float(layer, wq, act)


def recipe_of(layer: QuantConv2d | QuantLinear) -> LayerRecipe:
    """The recipe a fake-quant layer was built from."""
    aq, wq, obs = layer.act_quant, layer.weight_quant, layer.act_quant.observer
    mix = None if aq.mix is None else MixRecipe(aq.mix.beta, aq.mix.until, aq.mix.start)
    return LayerRecipe(wq.prec.bits, aq.bits, aq.method, mix, aq.nonfinite, obs.threshold,
                       obs.percentile, {"bins": obs.bins, "momentum": obs.momentum,
                                        "tau": obs.tau, "eta": obs.eta})

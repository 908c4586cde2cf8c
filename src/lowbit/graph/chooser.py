"""Who decides what runs a layer: one chooser per plan, asked twice per layer.

`Chooser.implementation(workload)` (the planner asks it first, on the layer's bare workload):
the implementation (a registered template, or `torch.fp16`) and why; it fixes the operand
layout (bit planes for a bit-serial family, one value per byte otherwise), so the planner can
then decide the layer's realizations and its kernel's own epilogue
(`kernel_epilogues.kernel_epilogue`). `Chooser.kernel(workload, impl)` (asked on the final
workload, epilogue included: the form the engine runs) picks the template and config, in this
order:

1. **tuned**: the fastest verified measurement of this very workload in the tuning records
   (`lowbit.tune.records`, the database `lowbit tune` writes), on the plan's GPU when it has
   one, else on any GPU;
2. **predicted** (the "model" chooser only): the performance model's pick among the
   candidate configs of the templates the layer may move to (`lowbit.tune.dispatch.choose`),
   except on the block-end epilogues its measurements never covered
   (`dispatch.outside_model_data`: the default);
3. **default**: the template's own default config (`default_bitserial`'s kernel for a
   bit-serial layer: the untuned family and config measured best per regime).

A tuned or predicted pick may change the template only where the launch stays the same
kind: any template that runs the workload when its kernel writes the layer's one output
itself (a requantizing workload), otherwise only among the bit-serial families (an
accumulator written for a separate pass or for the fused multi-output epilogue keeps its
template).

`make_chooser(name_or_chooser, records, gpu)` builds one: "default" (the measured policy of
`lowbit.graph.impl.choose_impl`), "model" (configs by the performance model, implementations by
the measured policy), or a callable `(workload) -> (impl, reason)` policy for implementations.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from ..core import Config, Workload
from ..kernels import get_template, load_backends, templates
from ..tune.records import RecordsDB, default_db_path
from .impl import TORCH_FP16, ImplChooser, choose_impl, is_bitserial

#: where a layer's kernel config comes from (`Layer.config_source`)
TUNED, PREDICTED, DEFAULT = "tuned", "predicted", "default"
#: the names `make_chooser` knows
CHOOSERS = ("default", "model")


@dataclass(frozen=True)
class KernelChoice:
    """What runs a layer's final workload: template, config (None for torch.fp16), source
    (TUNED / PREDICTED / DEFAULT) and why."""

    template: str
    config: Config | None
    source: str
    reason: str


def _layout_twins(workload: Workload, impl: str) -> list[str]:
    """The templates a pick may move the layer to (module docstring)."""
    load_backends()
    if workload.epilogue.requantizes:
        names = [t.name for t in templates()]
    elif is_bitserial(impl):
        names = [t.name for t in templates() if is_bitserial(t.name)]
    else:
        return [impl]
    out = []
    for name in names:
        with contextlib.suppress(Exception):  # a template that cannot judge: not a candidate
            if get_template(name).supports(workload):
                out.append(name)
    return out


def default_kernel(workload: Workload, impl: str, arch: str | None = None) -> KernelChoice:
    """The untuned kernel of `impl` for `workload`: `default_bitserial`'s family and config for
    a bit-serial layer, else the template's default config."""
    if impl == TORCH_FP16:
        return KernelChoice(TORCH_FP16, None, DEFAULT, "PyTorch fp16 layer (exact fp16 "
                                                       "tensor-core template or float64)")
    load_backends()
    if is_bitserial(impl):
        from ..kernels.cuda import default_bitserial

        family, cfg = default_bitserial(workload, arch)
        return KernelChoice(family.name, cfg, DEFAULT, "untuned bit-serial default "
                                                       "(family and config by regime)")
    template = get_template(impl)
    return KernelChoice(impl, template.default_config(workload), DEFAULT,
                        "the template's default config")


class Chooser:
    """The default chooser: implementations by `policy` (default: the measured policy
    `lowbit.graph.impl.choose_impl`), configs from the tuning `records` (a RecordsDB, a path,
    or None: no records) on `gpu` (None: any GPU), else the template's default (module
    docstring). `arch`: the CUDA arch of the plan's kernels (None: the current GPU's, else
    sm_90a)."""

    name = "default"

    def __init__(self, records: RecordsDB | str | Path | None = None,
                 policy: ImplChooser | None = None, gpu: str | None = None,
                 arch: str | None = None) -> None:
        if policy is not None and not callable(policy):
            raise TypeError(f"policy must be callable (workload) -> (impl, reason), got "
                            f"{policy!r}")
        if records is not None and not isinstance(records, (RecordsDB, str, Path)):
            raise TypeError(f"records must be a lowbit.tune.RecordsDB, a path or None, got "
                            f"{type(records).__name__}")
        self.policy = policy or choose_impl
        self.records = records
        self.gpu, self.arch = gpu, arch
        self._db: RecordsDB | None = records if isinstance(records, RecordsDB) else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(records={self.records!r}, gpu={self.gpu!r})"

    # ------------------------------------------------------------------ records
    def _open(self) -> RecordsDB | None:
        if self._db is None and self.records is not None:
            path = Path(self.records)
            if not path.is_file():
                return None
            self._db = RecordsDB(path)
        return self._db

    def close(self) -> None:
        if self._db is not None and not isinstance(self.records, RecordsDB):
            self._db.close()
        self._db = None

    def recorded(self, workload: Workload, impl: str) -> KernelChoice | None:
        """The records' fastest measurement of `workload` on a template the layer may move to,
        None without one."""
        db = self._open()
        if db is None:
            return None
        allowed = set(_layout_twins(workload, impl))
        best = None
        for gpu in ([self.gpu] if self.gpu else [None]):
            for name in allowed:
                rec = db.best(workload, gpu, name)
                if rec is not None and (best is None or rec.time_us < best.time_us):
                    best = rec
        if best is None:
            return None
        return KernelChoice(best.template, best.cfg, TUNED,
                            f"tuned on {best.gpu}: {best.time_us:.1f} us")

    # ------------------------------------------------------------------ decisions
    def implementation(self, workload: Workload) -> tuple[str, str]:
        """The layer's implementation and why (module docstring)."""
        return self.policy(workload)

    def predicted(self, workload: Workload, impl: str) -> KernelChoice | None:
        """The performance model's pick (None: this chooser does not predict)."""
        return None

    def kernel(self, workload: Workload, impl: str) -> KernelChoice:
        """Template and config of the final `workload` that `impl` runs (module docstring)."""
        if impl == TORCH_FP16:
            return default_kernel(workload, impl, self.arch)
        return (self.recorded(workload, impl) or self.predicted(workload, impl)
                or default_kernel(workload, impl, self.arch))


class ModelChooser(Chooser):
    """Configs (and the bit-serial family) by the performance model (`lowbit.tune.dispatch`),
    records first where they have the layer; implementations by the measured policy, as the
    default chooser's. The model ranks one layer's kernels in isolation: moving a layer off
    bit planes, or onto PyTorch fp16, changes its neighbours' operand layouts and which block
    ends fuse, costs it cannot see (on ResNet-50 b256 w1a2 its implementation picks made the
    network 2.64x slower than the tuned one: H100, tuning_network-20261207-091920.json)."""

    name = "model"

    def predicted(self, workload: Workload, impl: str) -> KernelChoice | None:
        from ..tune.dispatch import choose, outside_model_data

        why = outside_model_data(workload)
        if why:  # the default, saying why it was not predicted
            d = default_kernel(workload, impl, self.arch)
            return KernelChoice(d.template, d.config, DEFAULT, f"{d.reason}; {why}")
        names = _layout_twins(workload, impl)
        pool = [get_template(n) for n in names]
        try:
            pick = choose(workload, self.gpu, templates=pool, include_fp16=False)
        except ValueError:
            return None
        if pick.config is None or pick.template not in names:
            return None
        return KernelChoice(pick.template, pick.config, PREDICTED, pick.reason)


def make_chooser(chooser: str | Chooser | ImplChooser | None = None,
                 records: RecordsDB | str | Path | bool | None = True,
                 gpu: str | None = None) -> Chooser:
    """A Chooser from a name ("default", "model"), a Chooser (returned as it is), or an
    implementation policy `(workload) -> (impl, reason)`. records: True (the user's tuning
    database, `lowbit.tune.records.default_db_path`, where it exists), False / None (no
    records), or a database / path."""
    if isinstance(chooser, Chooser):
        return chooser
    if records is True:
        records = default_db_path()
    elif records is False:
        records = None
    if chooser is None or chooser == "default":
        return Chooser(records, gpu=gpu)
    if chooser == "model":
        return ModelChooser(records, gpu=gpu)
    if isinstance(chooser, str):
        raise ValueError(f"chooser must be one of {CHOOSERS}, a lowbit.graph.Chooser or a "
                         f"callable (workload) -> (impl, reason), got {chooser!r}")
    if not callable(chooser):
        raise TypeError(f"chooser must be one of {CHOOSERS}, a lowbit.graph.Chooser or a "
                        f"callable (workload) -> (impl, reason), got {type(chooser).__name__}")
    return Chooser(records, policy=chooser, gpu=gpu)

"""The bit-serial kernel families together: which family owns a kernel's parameters, the one
migration of records made before the split, and the best untuned bit-serial kernel.

Until the split every bit-serial kernel was one template, "cuda.bitserial", whose configs held
every knob (23; records made before a knob existed lack it, meaning its neutral value), and
"cuda.int8_wgmma"'s configs held MMA, WM, ROWSUM and SPLIT_K at fixed values. `migrate_config`
maps such a config to its family's template and config; anything else passes unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...core import Config, Workload
from . import bitserial_defaults as defaults
from .bitserial_family import SPEC_NEUTRAL, BitserialFamily, target_arch
from .bitserial_layout import acc_regs
from .bitserial_mma_sync import MMA_SYNC, MMA_SYNC_PERSISTENT
from .bitserial_shape import WGMMA_ARCH, threshold_epilogue
from .bitserial_tap_shift import TAP_SHIFT
from .bitserial_wgmma import WGMMA, WGMMA_PERSISTENT, small_grid_default
from .int8_wgmma import INT8_WGMMA

FAMILIES: tuple[BitserialFamily, ...] = (MMA_SYNC, MMA_SYNC_PERSISTENT, WGMMA, WGMMA_PERSISTENT,
                                         TAP_SHIFT)
BY_NAME: dict[str, BitserialFamily] = {f.name: f for f in (*FAMILIES, INT8_WGMMA)}
#: the template name of the single bit-serial template before the split
LEGACY = "cuda.bitserial"
#: the one migration table: (MMA, PERSIST, TAP_SHIFT) of a "cuda.bitserial" config -> family
MIGRATION = {("mma_sync", 0, 0): MMA_SYNC, ("mma_sync", 1, 0): MMA_SYNC_PERSISTENT,
             ("wgmma", 0, 0): WGMMA, ("wgmma", 1, 0): WGMMA_PERSISTENT,
             ("wgmma", 0, 1): TAP_SHIFT, ("wgmma", 1, 1): TAP_SHIFT}


def family_of(spec: Mapping) -> BitserialFamily:
    """The family whose kernel a full parameter set is (ValueError if none)."""
    key = (spec["MMA"], int(spec["PERSIST"]), int(spec["TAP_SHIFT"]))
    family = MIGRATION.get(key)
    if family is None or not family.owns(spec):
        raise ValueError(f"no bit-serial family has the kernel parameters {dict(spec)}")
    return family


def migrate_config(template: str, config: Mapping) -> tuple[str, Config]:
    """(template name, config) as today's templates know it: a "cuda.bitserial" config (knobs
    it lacks at their neutral values) becomes its family's, a "cuda.int8_wgmma" config loses
    the knobs that template no longer has (at their only value); others pass unchanged. What
    every reader of old measurements goes through (the tuning records, the results files).
    ValueError for a legacy config that no family's kernel has, lacks a knob with no neutral
    value, or sets parameters no kernel has (a probe's variant)."""
    try:
        name, cfg = _migrated(template, config)
    except KeyError as e:
        raise ValueError(f"{template} config {dict(config)} lacks {e}") from None
    if name in BY_NAME and (template == LEGACY or cfg != Config(config)):
        unknown = set(config) - set(BY_NAME[name].spec(cfg))
        if unknown:
            raise ValueError(f"{template} config sets {sorted(unknown)}, which no kernel has")
    return name, cfg


def _migrated(template: str, config: Mapping) -> tuple[str, Config]:
    if template == LEGACY:
        spec = {k: v for k, v in SPEC_NEUTRAL.items() if v is not None}
        spec.update(config)
        family = family_of(spec)
        return family.name, family.config_of(spec)
    if template == INT8_WGMMA.name and set(config) - set(INT8_WGMMA.knobs.names):
        spec = {**INT8_WGMMA.fixed, **config}
        if not INT8_WGMMA.owns(spec):
            raise ValueError(f"{template} config {dict(config)} fixes a knob to another value")
        return template, INT8_WGMMA.config_of(spec)
    return template, Config(config)


def kernel_spec(template: str, config: Mapping) -> Config:
    """The full kernel parameters (BM, BN, WM, WN, KT, STAGES, MMA, PERSIST, TAP_SHIFT, ...) of
    a config of a bit-serial template, legacy names included: what a reader of records needs
    to tell the kernels apart (the families' configs leave their fixed parameters out)."""
    name, cfg = migrate_config(template, config)
    if name not in BY_NAME:
        raise ValueError(f"{template!r} is not a bit-serial template")
    return BY_NAME[name].spec(cfg)


def default_bitserial(workload: Workload, arch: str | None = None
                      ) -> tuple[BitserialFamily, Config]:
    """The best untuned bit-serial kernel for `workload` on `arch` (default `target_arch()`):
    (family template, config). On sm_90a the first fitting entry of the wgmma kinds' preferred
    list (`bitserial_defaults.PREFERRED`: wide one-tile blocks, tap-shift teams, fused planes,
    persistent tap-shift blocks, then one-tile blocks by N), refined for small grids with long
    reductions (`small_grid_default`); elsewhere the mma.sync list. Measured on an H100 the
    wgmma defaults ran 1.3-2.1x faster than the mma.sync ones on every GEMM and ResNet-50 row,
    and requantizing by thresholds (where the output allows) won every row of both kinds."""
    arch = arch or target_arch()
    kind = "wgmma" if arch == WGMMA_ARCH else "mma_sync"
    requant = "threshold" if threshold_epilogue(workload) else "multiply"
    spaces = {}
    for name, d in defaults.PREFERRED[kind]:
        family = BY_NAME[name]
        if not family.supports(workload) or family.arch_reason(arch):
            continue
        if name not in spaces:
            spaces[name] = family.space(workload, arch)
        cfg = Config({**family.knobs.neutral(), **d, "REQUANT": requant})
        spec = family.spec(cfg)
        if spaces[name].is_valid(cfg) and defaults.regime_fits(workload, spec,
                                                              acc_regs(workload, spec)):
            if kind == "wgmma":
                spec = small_grid_default(workload, spec, WGMMA.space(workload, arch))
                family = family_of(spec)
            return family, family.config_of(spec)
    for family in FAMILIES:  # none fits: the first config of the kind's first family
        if family.kind == kind and family.supports(workload) and not family.arch_reason(arch):
            configs = family.space(workload, arch).all_configs()
            if configs:
                return family, configs[0]
    raise ValueError(f"no bit-serial kernel for {workload.key} on {arch}")

"""The launch geometry of a measured or candidate (template, workload, config).

Every registered template reports its own geometry (`KernelTemplate.geometry`,
`lowbit.kernels.geometry.Geometry`); this module finds the template a measurement names (rows
of the single "cuda.bitserial" template and old `cuda.int8_wgmma` configs through
`lowbit.kernels.cuda.migrate_config`), adds the library fp16 path (`TORCH_FP16`, not a
template: `fp16_geometry`), and reads a template that reports nothing (a name no registered
template has, a template defined outside lowbit) by its knobs' common names
(`launch.launch_shape`), so every point gets a geometry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..core import Config, Workload
from ..kernels import get_template, load_backends
from ..kernels.base import TORCH_FP16
from ..kernels.cuda import migrate_config
from ..kernels.geometry import Geometry, conv_taps, launch_geometry
from .launch import launch_shape


def fp16_geometry(wl: Workload, block_m: int = 128, block_n: int = 128, split: int = 1
                  ) -> Geometry:
    """The library fp16 path (cuDNN / cuBLAS) seen as one of its tilings: block_m x block_n x
    64 tiles, 8 warps, 3 stages, `split`-way split-K (`fit.fp16_estimate_us` takes the
    fastest of a few, as the library's heuristics pick a kernel per shape)."""
    m, n, k = wl.gemm_shape
    taps, chans = conv_taps(wl)
    steps = taps * math.ceil(chans / 64)
    return Geometry("fp16", "fp16", m, n, k, block_m, block_n, math.ceil(m / block_m) * block_m,
                    math.ceil(m / block_m) * math.ceil(n / block_n), split, 64,
                    math.ceil(steps / split), 256, 3, 3 * (block_m + block_n) * 64 * 2,
                    min(255, block_m * block_n // 256 + 40), False, 1, 2.0)


def template_of(template: object, config: Mapping) -> tuple[object | None, Mapping]:
    """(the template that `template` (a template, or its name) names, `config` as it knows
    it): a name is looked up among the registered templates after migration (module doc);
    (None, config) for a name no template has."""
    if not isinstance(template, str):
        return template, config
    try:
        name, migrated = migrate_config(template, config)
    except ValueError:
        return None, config
    load_backends()
    try:
        return get_template(name), migrated
    except ValueError:
        return None, config


def spec_of(template: object, config: Mapping) -> Mapping:
    """What the model reads of a config: the template's full kernel parameters
    (`KernelTemplate.spec`; a bit-serial family's fixed parameters included, rows of the
    single template it replaced too), else the config itself."""
    found, cfg = template_of(template, config)
    if found is None or not hasattr(found, "spec"):
        return config
    try:
        return found.spec(cfg)
    except (ValueError, KeyError):
        return config


def geometry(template: object, workload: Workload, config: Mapping) -> Geometry:
    """Geometry of `config` for `workload` on `template` (a template or its name; TORCH_FP16
    gives `fp16_geometry`)."""
    name = template if isinstance(template, str) else getattr(template, "name", "")
    if name == TORCH_FP16:
        return fp16_geometry(workload)
    found, cfg = template_of(template, config)
    if hasattr(found, "geometry"):
        try:
            return found.geometry(workload, cfg)
        except NotImplementedError:
            pass
    # a template that reports no geometry: read by its knobs' common names (module doc)
    return launch_geometry(workload, launch_shape(workload, Config(cfg), found))

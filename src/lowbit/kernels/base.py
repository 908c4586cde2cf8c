"""The plug-in interface every kernel template implements, and the kernels it builds.

The tuner only sees this interface: `supports`, `space`, `default_config`, `build`. A Kernel
is called as `kernel(x, w, params) -> out` with operands in the storage layouts the workload
names (`lowbit.core.validate`) and returns the output in the epilogue's layout; it must equal
`lowbit.reference.run(workload, x, w, params)` bit for bit (integer outputs).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import ClassVar, Protocol

import torch

from ..core import Config, ConfigSpace, Workload
from ..core.epilogue import EpilogueParams
from .geometry import Geometry, LaunchShape, launch_geometry

#: int32 accumulators are exact while the worst-case |sum| stays below this
EXACT_INT32 = 2**31
#: the implementation name of PyTorch's own fp16 path (cuDNN / cuBLAS on fp16 tensors), a
#: pseudo-template no registry holds: what the planner gives a layer no integer template runs
#: (the engine then runs it on the exact fp16 conv template where it can), and the baseline the
#: performance model and the dispatcher estimate beside the templates
TORCH_FP16 = "torch.fp16"


def pow2_ceil(n: int) -> int:
    """The least power of two >= n (1 for n <= 1): tile sizes rounded up."""
    return 1 << max(0, (n - 1).bit_length())


def acc_bound(wl: Workload) -> int:
    """Worst-case |accumulator| of the workload's conv / GEMM (every backend's exactness
    check)."""
    def max_abs(p) -> int:
        return max(abs(p.qmin), abs(p.qmax))

    return max_abs(wl.a) * max_abs(wl.w) * wl.gemm_shape[2]


def grouped_reason(wl: Workload) -> str | None:
    """Why a dense-conv template cannot run `wl`: a grouped or depthwise conv (groups > 1),
    which `triton.conv2d_depthwise` / `triton.conv2d_grouped_int8` serve; None otherwise."""
    groups = getattr(wl, "groups", 1)
    if groups == 1:
        return None
    return (f"groups={groups}: dense-conv template (grouped and depthwise convs run on "
            "triton.conv2d_grouped_int8 / triton.conv2d_depthwise)")


class Kernel(Protocol):
    workload: Workload
    config: Config

    def __call__(self, x: torch.Tensor, w: torch.Tensor,
                 params: EpilogueParams) -> torch.Tensor: ...

    def bind(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
             out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        """Check the inputs once and return a launcher for these tensors that does no host
        work beyond the launch (no checks, no syncs): what timing and graph capture call."""
        ...


def block_end_refusal(workload: Workload) -> str | None:
    """Why a template that does not run the block-end epilogue (Epilogue.requant32: int32
    vectors, a narrow residual, derived outputs, store_out=False) refuses `workload`; None for
    the epilogues it does run."""
    epi = workload.epilogue
    if epi.requant32 or epi.derived or not epi.store_out:
        return ("the block-end epilogue (Epilogue.requant32 / derived outputs / store_out) is "
                "not in this template's epilogue")
    return None


class KernelTemplate(ABC):
    """A family of kernels for some workloads, parameterized by a ConfigSpace. A template
    whose class does not set `takes_block_end` refuses block-end epilogues
    (`block_end_refusal`) before its own `unsupported_reason` runs: none silently drops a
    derived output or misreads the 32-bit path's int32 vectors."""

    #: unique name used in records, e.g. "triton.igemm_int8"
    name: str = "abstract"
    #: "triton" or "cuda"
    backend: str = "abstract"
    #: knobs added after configs of this template were first recorded, with the value that a
    #: config lacking the knob meant (records and results files stay buildable)
    added_knobs: ClassVar[Mapping[str, object]] = {}
    #: runs the block-end epilogue (Epilogue.requant32, derived outputs, store_out=False)
    takes_block_end: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("unsupported_reason")
        if own is None or getattr(own, "block_end_guarded", False):
            return

        @functools.wraps(own)
        def unsupported_reason(self, workload: Workload) -> str | None:
            if not self.takes_block_end:
                reason = block_end_refusal(workload)
                if reason:
                    return reason
            return own(self, workload)

        unsupported_reason.block_end_guarded = True  # type: ignore[attr-defined]
        cls.unsupported_reason = unsupported_reason  # type: ignore[method-assign]

    @abstractmethod
    def unsupported_reason(self, workload: Workload) -> str | None:
        """None when this template can run `workload`, else why it cannot."""

    def supports(self, workload: Workload) -> bool:
        return self.unsupported_reason(workload) is None

    def check_supported(self, workload: Workload) -> None:
        reason = self.unsupported_reason(workload)
        if reason:
            raise ValueError(f"{self.name} does not support {workload.key}: {reason}")

    def with_added_knobs(self, config: Mapping, names: tuple[str, ...]) -> Config:
        """`config` with the knobs of `added_knobs` among `names` that it lacks, at the value
        a config recorded before the knob existed meant."""
        return Config({**{k: v for k, v in self.added_knobs.items() if k in names}, **config})

    def spec(self, config: Mapping) -> Config:
        """The full kernel parameters of `config`: the config itself, unless the template fixes
        parameters its configs leave out (the bit-serial families)."""
        return Config(config)

    def geometry(self, workload: Workload, config: Mapping) -> Geometry:
        """One launch of `config` on `workload` as an implicit GEMM (`kernels.geometry`): what
        the performance model reads. This default serves templates that report a
        `launch_shape(workload, config) -> dict` of `LaunchShape` fields (plain tiles of one
        implicit GEMM); the others report their own geometry."""
        launch_shape = getattr(self, "launch_shape", None)
        if launch_shape is None:
            raise NotImplementedError(f"template {self.name} reports no geometry: define "
                                      "geometry() or launch_shape()")
        return launch_geometry(workload, LaunchShape.of(workload, launch_shape(workload, config)))

    def checked_config(self, workload: Workload, config: Config,
                       space: ConfigSpace | None = None) -> Config:
        """`config` as a Config after checking the workload is supported and the config is a
        point of this template's space for it (`space`, default `self.space(workload)`;
        ValueError naming the reason otherwise); knobs of `added_knobs` it lacks take their old
        meaning."""
        self.check_supported(workload)
        if space is None:  # not `space or ...`: a ConfigSpace's truth value enumerates it
            space = self.space(workload)
        config = self.with_added_knobs(config, space.names)
        reason = space.why_invalid(config)
        if reason:
            raise ValueError(f"config {config} is not in {self.name}'s space for "
                             f"{workload.key}: {reason}")
        return config

    @abstractmethod
    def space(self, workload: Workload) -> ConfigSpace:
        """The config space for this workload (constraints included)."""

    @abstractmethod
    def default_config(self, workload: Workload) -> Config:
        """An untuned, always-valid config (the stock-schedule baseline)."""

    @abstractmethod
    def build(self, workload: Workload, config: Config) -> Kernel:
        """Compile (or fetch from cache) the kernel for (workload, config)."""


_REGISTRY: dict[str, KernelTemplate] = {}


def register(template: KernelTemplate) -> KernelTemplate:
    """Add a template to the registry the tuner and the ops choose from."""
    if template.name in _REGISTRY:
        raise ValueError(f"template {template.name!r} is already registered")
    _REGISTRY[template.name] = template
    return template


def templates() -> list[KernelTemplate]:
    """All registered templates (importing lowbit.kernels registers the built-in ones)."""
    return list(_REGISTRY.values())


def get_template(name: str) -> KernelTemplate:
    if name not in _REGISTRY:
        raise ValueError(f"unknown template {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]

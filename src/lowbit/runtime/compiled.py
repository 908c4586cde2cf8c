"""`lowbit.compile(model, example_input) -> CompiledModel`: a quantized model as one plan of fused
integer layers per input shape, run by an executor.

The model is a fake-quant model of `lowbit.quantize` (trained or calibrated) or one converted
by `lowbit.convert`. It is traced with torch.fx (`lowbit.graph.trace_model`), its activation
ranges recorded on `example_input` (the wide realizations of residual adds and average pools
take their scales from it: pass a representative batch), and planned
(`lowbit.graph.build_plan`): `CompiledModel.plan` is the plan for the example input's shape,
and `print(compiled.summary())` shows it. Other input shapes are planned on first use.

Executors (`EXECUTORS`): "gpu" (`lowbit.runtime.gpu`: the plan's kernels bound once, packed
tensors in one arena, the forward replayed as one CUDA graph) for inputs on a CUDA device, and
the exact reference (`lowbit.runtime.engine`, int64 on the input's device) otherwise, with a
warning (once per compiled model) since it is slow.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from ..core import Workload
from ..core.progress import progress
from ..graph import Dataflow, Plan, PlanOptions, build_plan, trace_model
from ..graph.chooser import Chooser, make_chooser
from ..graph.dataflow import is_integer_module, is_quant_layer
from ..graph.impl import ImplChooser
from ..graph.ir import WIDE_BITS
from ..graph.summary import plan_table
from ..quant.inputs import InputShapeError, checked_layer_inputs
from ..quant.modules import QUANT_MODULES
from ..reference.image import normalize_uint8_image
from .engine import ReferenceExecutor
from .gpu import capturing, gpu_executor

#: executor factories by name: (plan, device) -> callable(x, record=False)
EXECUTORS: dict[str, Callable[[Plan, torch.device], Callable]] = {
    "reference": ReferenceExecutor, "gpu": gpu_executor}


def _check_image(name: str, x: object, channels: int | None = None,
                 device: torch.device | None = None, uint8: bool = False,
                 finite: bool = True) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (float NCHW image batch), got "
                        f"{type(x).__name__}")
    if uint8 and x.dtype != torch.uint8:
        raise TypeError(f"{name} must be a uint8 NCHW image batch (pixel values; the model "
                        f"was compiled with uint8_input), got {x.dtype}")
    if not uint8 and not x.dtype.is_floating_point:
        raise TypeError(f"{name} must have a floating-point dtype (float32, float16, bfloat16 "
                        f"or float64), got {x.dtype}")
    if x.dim() != 4 or min(x.shape) < 1:
        raise ValueError(f"{name} must be a non-empty NCHW batch [N, C, H, W], got shape "
                         f"{tuple(x.shape)}")
    if channels is not None and x.shape[1] != channels:
        raise ValueError(f"{name} must have {channels} channels (dim 1), got shape "
                         f"{tuple(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} is on {x.device}, but the model was compiled for {device} "
                         "(example_input's device)")
    if finite and not uint8 and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} has non-finite values (inf or nan)")
    return x


def _check_model(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    layers = [(n, m) for n, m in model.named_modules() if is_quant_layer(m)]
    if not layers:
        raise ValueError("model has no lowbit quantized layers: call lowbit.quantize (then "
                         "train or lowbit.calibrate) or lowbit.convert first")
    for name, m in layers:
        if isinstance(m, QUANT_MODULES) and int(m.act_quant.observer.seen) == 0:
            raise ValueError(f"layer {name} has no activation range: the model was never "
                             "calibrated (train it or run lowbit.calibrate(model, loader))")
        if not isinstance(m, QUANT_MODULES) and not is_integer_module(m):
            raise TypeError(f"layer {name} is not a lowbit layer")


#: numbers of the custom ops `CompiledModel.as_op` registers (one name each)
_OP_IDS = itertools.count()


class CompiledModel(nn.Module):
    """forward(float NCHW batch) -> float output, through the plan for the batch's shape
    (module docstring). Attributes: plan (the first plan: the example input's shape), device,
    executor ('reference' or 'gpu'). Built by `compile_model`, or from saved plans by
    `from_plan` (then only their input shapes run)."""

    def __init__(self, plan: Plan, *, dataflow: Dataflow | None = None,
                 model: nn.Module | None = None, chooser: Chooser | None = None,
                 device: torch.device | str = "cpu", executor: str = "auto",
                 wide_bits: int = 24, options: PlanOptions | None = None) -> None:
        super().__init__()
        if executor not in ("auto", *EXECUTORS):
            raise ValueError(f"executor must be 'auto' or one of {sorted(EXECUTORS)}, got "
                             f"{executor!r}")
        self.model = model  # holds the FloatFallback modules of plans built from dataflow
        self.dataflow = dataflow
        self.chooser = chooser or make_chooser(None, records=False)
        self.options = options or PlanOptions()
        self.wide_bits = wide_bits
        self.plan = plan
        self.channels = int(plan.input_spec.shape[1])
        self.device = torch.device(device)
        use_gpu = executor == "gpu" or (executor == "auto" and "gpu" in EXECUTORS
                                        and self.device.type == "cuda")
        self.executor = "gpu" if use_gpu else "reference"
        self._warned = False
        self._plans: dict[tuple[int, ...], Plan] = {plan.input_spec.shape: plan}
        self._runners: dict[tuple[int, ...], Callable] = {}

    @classmethod
    def from_plan(cls, plan: Plan, device: torch.device | str = "cpu",
                  executor: str = "auto") -> CompiledModel:
        """A compiled model running `plan` (e.g. one `Plan.from_dict` restored) for inputs
        of its shape."""
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a lowbit.graph.Plan, got {type(plan).__name__}")
        return cls(plan, device=device, executor=executor)

    @property
    def plans(self) -> list[Plan]:
        """Every plan this model holds, one per input shape, in the order they were made."""
        return list(self._plans.values())

    def add_plan(self, plan: Plan) -> None:
        """Run `plan` for inputs of its shape (e.g. a saved model's other shapes); ValueError
        where the model already holds a plan for that shape."""
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a lowbit.graph.Plan, got {type(plan).__name__}")
        if plan.input_spec.shape in self._plans:
            raise ValueError(f"this compiled model already holds a plan for inputs of shape "
                             f"{plan.input_spec.shape}")
        self._plans[plan.input_spec.shape] = plan

    def plan_for(self, shape: tuple[int, ...]) -> Plan:
        """The plan for inputs of `shape` (built once per shape)."""
        shape = tuple(int(s) for s in shape)
        if shape not in self._plans:
            if self.dataflow is None:
                raise ValueError(f"x must have shape {self.plan.input_spec.shape} (this "
                                 f"compiled model holds plans for {sorted(self._plans)}); "
                                 f"compile the model again for inputs of shape {shape}")
            self._plans[shape] = build_plan(self.dataflow, shape, self.chooser,
                                            self.wide_bits, options=self.options,
                                            image_normalization=self.plan.image_normalization)
        return self._plans[shape]

    def summary(self, shape: tuple[int, ...] | None = None) -> str:
        return plan_table(self.plan_for(shape or self.plan.input_spec.shape))

    def _runner(self, shape: tuple[int, ...]) -> Callable:
        if shape not in self._runners:
            self._runners[shape] = EXECUTORS[self.executor](self.plan_for(shape), self.device)
        return self._runners[shape]

    def run(self, x: torch.Tensor, record: bool = False, copy_output: bool = True
            ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """forward, and with `record` also every tensor the plan writes (engine.run_plan).
        copy_output=False (GPU executor): the logits in the engine's own buffer, which the
        next forward of this shape overwrites, instead of a copy. Inside the caller's CUDA
        graph capture (GPU executor, after one call of this shape outside it, which compiles
        the kernels) the launches go into the caller's graph instead of this model's own, and
        the non-finite checks, which read the device, are skipped."""
        live = capturing(self.device)
        x = _check_image("x", x, self.channels, self.device,
                         uint8=self.plan.image_normalization is not None, finite=not live)
        if live and (self.executor != "gpu" or tuple(x.shape) not in self._runners):
            raise ValueError("a compiled model runs inside a CUDA graph capture only on the "
                             "GPU executor and after one call with this input shape outside "
                             "the capture (it compiles the kernels)")
        if self.executor == "reference" and not self._warned:
            self._warned = True
            warnings.warn("lowbit.compile: running the plan through the exact reference "
                          "executor (int64, slow); the GPU executor is not available here",
                          RuntimeWarning, stacklevel=3)
        runner = self._runner(tuple(x.shape))
        if self.executor == "gpu" and not copy_output:
            return runner(x, record, copy_output=False)
        return runner(x, record)

    def input_buffer(self, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The GPU executor's image buffer for inputs of `shape` (default: the compiled
        shape): write the next batch into it in place and pass it to forward, which then
        skips the input copy. ValueError on the reference executor."""
        if self.executor != "gpu":
            raise ValueError("input_buffer needs the GPU executor (executor='gpu'), this "
                             f"model runs the {self.executor!r} executor")
        shape = tuple(int(s) for s in (shape or self.plan.input_spec.shape))
        return self._runner(shape).input_buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)

    def as_op(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """This model as a PyTorch custom op (`torch.library.custom_op`, a fresh name
        `lowbit::compiled_<n>`) for inputs of the compiled shape: `torch.compile`d code calls
        it as one opaque node (fullgraph, no graph break) and PyTorch's fake tensors get its
        output's shape and dtype. Runs the model once (zeros) to learn them, which also
        compiles the kernels."""
        shape = tuple(self.plan.input_spec.shape)
        dtype = torch.uint8 if self.plan.image_normalization is not None else torch.float32
        with torch.no_grad():
            probe = self.run(torch.zeros(shape, dtype=dtype, device=self.device))
        out_shape, out_dtype = tuple(probe.shape), probe.dtype
        name = f"lowbit::compiled_{next(_OP_IDS)}"

        @torch.library.custom_op(name, mutates_args=(), device_types=self.device.type)
        def op(x: torch.Tensor) -> torch.Tensor:
            return self.run(x)

        @op.register_fake
        def _(x: torch.Tensor) -> torch.Tensor:
            if tuple(x.shape) != shape:
                raise ValueError(f"{name}: x must have the compiled shape {shape}, got "
                                 f"{tuple(x.shape)}")
            return x.new_empty(out_shape, dtype=out_dtype)

        return op


def compile_model(model: nn.Module, example_input: torch.Tensor, *,
                  chooser: str | Chooser | ImplChooser | None = None,
                  records: str | Path | bool | None = True,
                  choose_impl: ImplChooser | None = None, executor: str = "auto",
                  wide_bits: int = 24, options: PlanOptions | None = None,
                  uint8_input: tuple[Sequence[float], Sequence[float]] | None = None
                  ) -> CompiledModel:
    """Compile a quantized model (fake-quant from `lowbit.quantize`, trained or calibrated, or
    converted by `lowbit.convert`) for inputs like `example_input` (float NCHW; its value
    ranges set the wide realizations' scales).

    chooser: who decides each layer's implementation, kernel and config
    (`lowbit.graph.chooser`): "default" (the measured policy), "model" (the measured policy's
    implementations, configs by the performance model), a `lowbit.graph.Chooser`, or an
    implementation policy (workload) -> (impl, reason); choose_impl is the same as a policy.
    records: the tuning database whose best measurements of each layer's workload the plan runs
    (True: the user's, the one `lowbit tune` writes, where it exists; False / None: none; or a
    path), on the example input's GPU. executor: 'auto' (the GPU executor on a GPU when
    available, else the reference) or a name of `EXECUTORS`. wide_bits: 24 (default), 16 or 8,
    the width of the residual adds' and average pools' realizations (`lowbit.graph.planner`).
    options: `lowbit.graph.PlanOptions` (fused stem, kernel-written layer outputs, chained
    launches). uint8_input: (mean, std) per channel: the compiled model takes uint8 pixel values
    (what deployed pipelines decode; example_input too) and the model's input is their
    normalization ((v / 255) - mean) / std (torchvision's ToTensor + Normalize), exactly: the
    first layer quantizes each pixel by one table per channel (a quarter of the float image's
    bytes). The model is copied: later changes to it do not reach the compiled one."""
    _check_model(model)
    norm = None
    if uint8_input is not None:
        if not isinstance(uint8_input, (tuple, list)) or len(uint8_input) != 2:
            raise TypeError("uint8_input must be (mean, std), each one value per channel")
        norm = tuple(tuple(float(v) for v in part) for part in uint8_input)
    _check_image("example_input", example_input, uint8=norm is not None)
    traced_input = example_input
    if norm is not None:
        traced_input = normalize_uint8_image(example_input, *norm)
    if choose_impl is not None:
        if not callable(choose_impl):
            raise TypeError(f"choose_impl must be callable (workload) -> (impl, reason), got "
                            f"{choose_impl!r}")
        if chooser is not None:
            raise ValueError("pass either chooser or choose_impl, not both")
        chooser = choose_impl
    if wide_bits not in (8, *WIDE_BITS):
        raise ValueError(f"wide_bits must be one of {(8, *WIDE_BITS)}, got {wide_bits!r}")
    if executor not in ("auto", *EXECUTORS):
        raise ValueError(f"executor must be 'auto' or one of {sorted(EXECUTORS)}, got "
                         f"{executor!r}")
    if options is not None and not isinstance(options, PlanOptions):
        raise TypeError(f"options must be a lowbit.graph.PlanOptions, got "
                        f"{type(options).__name__}")
    if not (isinstance(records, (bool, str, Path)) or records is None):
        raise TypeError(f"records must be True, False, None or a path, got "
                        f"{type(records).__name__}")
    if callable(chooser) and not isinstance(chooser, Chooser):
        chooser = _checked_policy(chooser, "choose_impl" if choose_impl else "chooser")
    device = example_input.device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    plan_chooser = make_chooser(chooser, records, gpu)
    # traced where the example runs: a model left on the CPU follows a CUDA example
    with progress("lowbit.compile: tracing and planning"):
        copied = copy.deepcopy(model).eval().to(device)
        try:
            with checked_layer_inputs(copied, f"example_input (shape "
                                              f"{tuple(example_input.shape)})"):
                dataflow = trace_model(copied, traced_input)
        except InputShapeError as e:  # without torch.fx's node trace appended to it
            raise InputShapeError(e.argument, e.layer, e.problem) from None
        plan = build_plan(dataflow, tuple(example_input.shape), plan_chooser, wide_bits,
                          options=options, image_normalization=norm)
    return CompiledModel(plan, dataflow=dataflow, model=copied, chooser=plan_chooser,
                         device=device, executor=executor, wide_bits=wide_bits,
                         options=options)


def _checked_policy(policy: ImplChooser, name: str) -> ImplChooser:
    """The caller's implementation policy, its answers checked: a TypeError naming the
    argument (`name`) for anything but (impl name, reason) strings."""

    def checked(workload: Workload) -> tuple[str, str]:
        got = policy(workload)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(s, str)
                                                                 for s in got)):
            raise TypeError(f"{name} must return (impl name, reason) strings, got {got!r} for "
                            f"{workload.key}")
        return got

    return checked

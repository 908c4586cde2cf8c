"""The GPU executor of a plan: every tensor in one static arena, every step bound once to its
kernels, the whole forward one CUDA graph.

`GpuExecutor(plan, device)` is called as the reference executor is (`x, record=False`) and
computes the same integers (`lowbit.runtime.engine` defines them), bit for bit:

- storage: each plan tensor is a view of one byte arena at a fixed offset (`buffers`: tensors
  whose lifetimes do not overlap share bytes; `reuse_memory=False` keeps every tensor);
  Flatten is a view (INT8 / wide: always; BITPLANE: when the map's channels fill whole words
  or the map is 1x1, the only flattens the planner makes of bit planes);
- Layer: the step's kernel (`layers.layer_kernel`: the plan's template and config, weights
  packed once into the workload's layout) with its own fused epilogue where the workload
  has one (its residual buffer passed with Epilogue.residual); where the plan says
  `outputs_in_kernel`, the int8 implicit GEMM writes every layer output from its accumulator
  tiles (`kernels.triton.conv_outputs`); else the kernel writes the accumulator (int16 where
  it fits a bit-serial kernel, `kernel_epilogues.accumulator_workload`; int32 otherwise) and
  `netops.bind_layer_epilogue` writes every output (bias at each output's shift, residual,
  wide and float outputs). A fused max-pool follows the kernel's own epilogue where that
  writes the layer's one output (full size, in scratch); else it pools the int32
  accumulator first where every output is requantized and there is no residual (the
  epilogue is monotone), else each output after the epilogue; `Layer.chained` kernels are
  bound as programmatic dependents of the previous launch;
- Quantize + first conv: where the plan fused them (`Layer.stem`), the Triton stem
  (`kernels.triton.stem`: float image -> quantized -> conv -> epilogue -> 3x3/2 max-pool);
  the Quantize's own tensor is then written only when recording or when another step reads
  it;
- MaxPool / AvgPool / Quantize: `kernels.triton.netops`; Concat: a copy into the output
  (words of bit planes where every part but the last fills whole words, else values);
  FloatFallback: the PyTorch module on the device, in fp16 (`lowbit.graph.fallbacks`; not
  bit-exact against a CPU reference: fp16 rounding, ~1e-3 relative, and a quantizer after it
  can flip a level near a rounding boundary); Gather / TableMul / ChannelAffine / narrow Lookup:
  `gpu_elementwise`; Output: scale * q in float64, rounded to float32, NCHW. The steps that
  run as PyTorch ops (Concat, a uint8 image's table Quantize, wide Lookup, FloatFallback,
  Output) are bound by `gpu_torch`.

Forward: the input is checked (type, dtype, shape, device) before any launch and copied into
a static buffer; then the CUDA graph of all launches replays (captured on the first call after
an eager warm-up; eager without CUDA); non-finite input sets a status flag in the quantize
kernels, read after the replay (ValueError). `record=True` runs the steps eagerly and returns
every tensor a step writes in its storage layout (as `ReferenceExecutor` does).

Without a GPU (device "cpu") the Triton ops run under TRITON_INTERPRET=1, the conv / GEMM
kernels through `layers.reference_kernel` (same bind contract) and the CUDA "ws" stem as the
shape's Triton stem (the same integers): the CPU tests of the whole executor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..core import Layout, PackedTensor, WidePrecision
from ..core.validate import operand_shapes, out_storage
from ..graph.ir import (
    AvgPool,
    Concat,
    Flatten,
    FloatFallback,
    Layer,
    Lookup,
    MaxPool,
    Output,
    Plan,
    Quantize,
    Step,
)
from ..graph.pools import ADAPTIVE, GLOBAL, WINDOW, axis_windows
from ..graph.stem_choice import as_stem_config, output_specs, stem_text
from ..kernels.base import acc_bound
from .buffers import Scratch, plan_arena, temporaries_bytes, view_of
from .gpu_elementwise import bind_elementwise, handles
from .gpu_torch import (
    bind_concat,
    bind_fallback,
    bind_image_lookup,
    bind_lookup,
    bind_output,
    float_maxpool,
)
from .layers import (
    KernelFactory,
    ReferenceKernel,
    describe_kernel,
    kernel_params,
    layer_kernel,
    packed_weight,
    prebuild,
    reference_kernel,
)


def _triton():
    """The Triton ops (imported on first use: importing Triton is slow and needs it set up)."""
    from ..kernels.triton import netops, stem, stored

    return netops, stem, stored


def conv_outputs():
    """The int8 kernels with a layer's whole epilogue fused (imported on first use)."""
    from ..kernels.triton import conv_outputs

    return conv_outputs


@dataclass
class BoundStep:
    """One plan step bound to its launches: `launches` run in order; `record_only` ones only
    when recording (the Quantize a fused stem made redundant); `how` says what runs."""

    step: Step
    launches: list[Callable[[], object]] = field(default_factory=list)
    how: str = ""
    record_only: bool = False

    @property
    def name(self) -> str:
        return self.step.name

    def __call__(self) -> None:
        for launch in self.launches:
            launch()


def _full_size(spec, shape) -> tuple[tuple[int, ...], torch.dtype]:
    """Storage shape and dtype of tensor `spec` at the pre-pool logical `shape` (a pooled
    layer writes its output full size, then pools it into `spec`)."""
    full = spec.__class__(spec.name, tuple(shape), spec.precision, spec.scale, spec.layout)
    return full.storage_shape, full.storage_dtype


class GpuExecutor:
    """Runs one plan on `device` (module docstring), binding each step as the plan decided
    (kernels, configs, fused stem, kernel-written layer outputs, chained launches: the
    plan's Layer fields). kernels: Layer step -> Kernel (default `layers.layer_kernel` on
    CUDA, `layers.reference_kernel` elsewhere; tests pass CPU stand-ins); reuse_memory: share
    bytes between tensors of disjoint lifetimes; use_graph: CUDA-graph replay (default on
    CUDA); check_finite: read the non-finite flag after every forward (a device sync) and
    raise ValueError."""

    def __init__(self, plan: Plan, device: torch.device | str = "cuda", *,
                 kernels: KernelFactory | None = None, reuse_memory: bool = True,
                 use_graph: bool | None = None, check_finite: bool = True) -> None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.plan, self.device = plan, device
        cuda = device.type == "cuda"
        self.kernels = kernels or (layer_kernel if cuda else reference_kernel)
        self.use_graph = cuda if use_graph is None else bool(use_graph)
        if self.use_graph and not cuda:
            raise ValueError("use_graph needs a CUDA device")
        self.check_finite = check_finite
        self.graph: torch.cuda.CUDAGraph | None = None
        readers: dict[str, list[Step]] = {}
        for s in plan.steps:
            for t in s.inputs:
                readers.setdefault(t, []).append(s)
        producers = {t: s for s in plan.steps for t in s.outputs}
        self.stems: dict[str, Quantize] = {s.name: producers[s.input] for s in plan.layers
                                           if s.stem}
        for name, q in self.stems.items():
            if not isinstance(q, Quantize):
                raise ValueError(f"{name}: a stem layer's input must be a Quantize step's")
        # a fused stem reads its Quantize step's float input itself, at the layer's step; and
        # the input image lives through the whole forward, so that every replay of the graph
        # (timing loops included) reads the same image
        index = {s.name: i for i, s in enumerate(plan.steps)}
        reads = {q.input: index[name] for name, q in self.stems.items()}
        reads[plan.input] = len(plan.steps) - 1
        self.arena = plan_arena(plan, reuse_memory, reads)
        self.memory = torch.empty(max(self.arena.nbytes, 1), dtype=torch.uint8, device=device)
        self.buffers: dict[str, torch.Tensor] = {}
        for name in self.arena.offsets:
            spec = plan.tensors[name]
            dtype = plan.input_dtype if name == plan.input else spec.storage_dtype
            self.buffers[name] = view_of(self.memory, self.arena.offsets[name],
                                         spec.storage_shape, dtype)
        self.status = torch.zeros(1, dtype=torch.int32, device=device)
        self.result = torch.empty(0, device=device)  # the Output step's binding sets it
        stem_only = {q.name for name, q in self.stems.items()
                     if all(r.name == name for r in readers[q.output])}
        if cuda:  # compile the layers' kernels side by side first
            prebuild([s for s in plan.layers if s.name not in self.stems], self.kernels)
        self.scratch = Scratch(max([temporaries_bytes(self._temporaries(s))
                                    for s in plan.steps] + [0]), device)
        self.steps: list[BoundStep] = []
        for step in plan.steps:
            self.scratch.reset()
            bound = self._bind(step)
            bound.record_only = step.name in stem_only
            self.steps.append(bound)

    # ------------------------------------------------------------------ storage
    def packed(self, name: str) -> PackedTensor:
        spec = self.plan.tensors[name]
        return PackedTensor(self.buffers[name], spec.shape, spec.precision, spec.layout)

    def _operand(self, name: str) -> PackedTensor | torch.Tensor:
        return self.buffers[name] if self.plan.tensors[name].is_float else self.packed(name)

    def nbytes(self) -> int:
        """Device bytes of the arena and the scratch region (weights not included)."""
        return self.memory.numel() + self.scratch.region.numel()

    # ------------------------------------------------------------------ binding
    def _temporaries(self, step: Step) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """Shapes / dtypes of the step-local temporaries `_bind_layer` takes."""
        if not isinstance(step, Layer) or step.name in self.stems:
            return []
        if step.workload.epilogue.requantizes:  # a pooled layer's full-size output
            if step.pool is None:
                return []
            spec = self.plan.tensors[step.layer_outputs[0].tensor]
            return [_full_size(spec, operand_shapes(step.workload)[2])]
        shape, acc_dtype = out_storage(step.workload)
        temps = [(tuple(shape), acc_dtype)]
        if step.pool is None:
            return temps
        if step.residual is None and all(o.requantized for o in step.layer_outputs):
            first = self.plan.tensors[step.layer_outputs[0].tensor]
            return [*temps, (first.shape, torch.int32)]
        for o in step.layer_outputs:
            spec = self.plan.tensors[o.tensor]
            if spec.is_float:
                temps.append(((shape[0], shape[3], shape[1], shape[2]), torch.float32))
            else:
                temps.append(_full_size(spec, shape))
        return temps

    def _bind(self, step: Step) -> BoundStep:
        netops, _, _ = _triton()
        plan = self.plan
        if isinstance(step, Layer):
            return self._bind_layer(step)
        if isinstance(step, Quantize) and step.table is not None:
            return BoundStep(step, *bind_image_lookup(self, step))
        if isinstance(step, Quantize):
            spec = plan.tensors[step.output]
            return BoundStep(step, [netops.bind_quantize(
                self.buffers[step.input], spec.scale, self.packed(step.output), step.relu,
                self.status)], "netops quantize")
        if isinstance(step, MaxPool):
            return self._bind_maxpool(step)
        if isinstance(step, AvgPool):
            return self._bind_avgpool(step)
        if isinstance(step, Flatten):
            self._flatten_view(step)
            return BoundStep(step, [], "view")
        if isinstance(step, Concat):
            return BoundStep(step, *bind_concat(self, step))
        if handles(self, step):
            return BoundStep(step, *bind_elementwise(self, step))
        if isinstance(step, Lookup):
            return BoundStep(step, *bind_lookup(self, step))
        if isinstance(step, FloatFallback):
            return BoundStep(step, *bind_fallback(self, step))
        if isinstance(step, Output):
            launches, how, self.result = bind_output(self, step)
            return BoundStep(step, launches, how)
        raise TypeError(f"unknown step {type(step).__name__}")

    @staticmethod
    def _bind_kernel(step: Layer, kernel, x, w, params, out) -> Callable[[], object]:
        if step.chained and hasattr(kernel, "chained_kernels"):
            return kernel.bind(x, w, params, out, chained=True)
        return kernel.bind(x, w, params, out)

    def _bind_layer(self, step: Layer) -> BoundStep:
        netops, stem, _ = _triton()
        plan, wl = self.plan, step.workload
        specs = output_specs(step, plan.tensors, plan.params)
        outs = [self._operand(o.tensor) for o in step.layer_outputs]
        if step.name in self.stems:
            q = self.stems[step.name]
            spec_in = plan.tensors[q.output]
            table = None if q.table is None else plan.params[q.table].to(self.device)
            config = as_stem_config(step.stem_config)
            if config is not None and config.kernel == "ws" and self.device.type != "cuda":
                config = None  # the CUDA kernel's CPU stand-in: the shape's Triton kernel
            launch = stem.bind_stem(
                self.buffers[plan.input], plan.params[step.weight].to(torch.int64), None, specs,
                outs, stride=wl.stride, pad=wl.pad,
                pool_pad=step.pool.pad if step.pool is not None else None,
                scale=spec_in.scale, precision=spec_in.precision, table=table,
                status=self.status, config=config)
            return BoundStep(step, [launch], stem_text(step) + f"; plan: {step.impl}")
        kernel = self.kernels(step)
        how = describe_kernel(step, kernel)
        x = self.buffers[step.input]
        w = packed_weight(step, plan, self.device)
        derived = [o for o in step.layer_outputs if o.derived]
        params = kernel_params(step, plan, self.device, self.buffers[step.residual]
                               if wl.epilogue.residual is not None else None,
                               [self.buffers[o.tensor] for o in derived]
                               if wl.epilogue.derived else None)
        if wl.epilogue.requant32:  # the block end: every output from the kernel's epilogue
            stored = [o for o in step.layer_outputs if not o.derived]
            out = self.buffers[stored[0].tensor] if stored else None
            return BoundStep(step, [self._bind_kernel(step, kernel, x, w, params, out)],
                             f"{how} (block-end epilogue: {len(step.layer_outputs)} outputs)")
        if wl.epilogue.requantizes:
            (o,) = step.layer_outputs
            if step.pool is None:
                return BoundStep(step, [self._bind_kernel(step, kernel, x, w, params,
                                                          self.buffers[o.tensor])],
                                 f"{how} (its own epilogue)")
            (full_storage,) = self._temporaries(step)
            spec = plan.tensors[o.tensor]
            full = PackedTensor(self.scratch.take(*full_storage), operand_shapes(wl)[2],
                                spec.precision, spec.layout)
            win = step.pool
            return BoundStep(step, [
                self._bind_kernel(step, kernel, x, w, params, full.data),
                netops.bind_maxpool2d(full, self.packed(o.tensor), win.kernel, win.stride,
                                      win.pad, win.ceil)], f"{how} (its own epilogue) + max-pool")
        res = self.packed(step.residual) if step.residual else None
        bound = acc_bound(wl)
        if step.outputs_in_kernel and not isinstance(kernel, ReferenceKernel):
            # (a CPU stand-in of the conv runs the same integers through the separate pass)
            return BoundStep(step, [conv_outputs().bind_conv_outputs(
                kernel, x, w, params, specs, outs, res, bound)], f"{how} (layer epilogue fused)")
        shape, acc_dtype = out_storage(wl)
        shape = tuple(shape)
        acc = self.scratch.take(shape, acc_dtype)  # int16 or int32 (graph.kernel_epilogues)
        launches = [self._bind_kernel(step, kernel, x, w, params, acc)]
        if step.pool is None:
            launches.append(netops.bind_layer_epilogue(acc, specs, outs, res, bound))
            return BoundStep(step, launches, f"{how} + netops epilogue")
        win = step.pool
        i32 = WidePrecision(32)
        if res is None and all(isinstance(s, netops.Requantized) for s in specs):
            pooled_shape = plan.tensors[step.layer_outputs[0].tensor].shape
            pooled = self.scratch.take(pooled_shape, torch.int32)
            launches.append(netops.bind_maxpool2d(
                PackedTensor(acc, shape, i32, Layout.INT8),
                PackedTensor(pooled, pooled_shape, i32, Layout.INT8),
                win.kernel, win.stride, win.pad, win.ceil))
            launches.append(netops.bind_layer_epilogue(pooled, specs, outs, None, bound))
            return BoundStep(step, launches, f"{how} + int32 max-pool + netops epilogue")
        temps = []
        for o, spec in zip(step.layer_outputs, specs, strict=True):
            t = plan.tensors[o.tensor]
            if t.is_float:
                temps.append(self.scratch.take((shape[0], shape[3], shape[1], shape[2]),
                                               torch.float32))
            else:
                full = self._temporaries(step)[len(temps) + 1]
                temps.append(PackedTensor(self.scratch.take(*full), shape, spec.precision,
                                          t.layout))
        launches.append(netops.bind_layer_epilogue(acc, specs, temps, res, bound))
        for o, t in zip(step.layer_outputs, temps, strict=True):
            if isinstance(t, PackedTensor):
                launches.append(netops.bind_maxpool2d(t, self.packed(o.tensor), win.kernel,
                                                      win.stride, win.pad, win.ceil))
            else:
                launches.append(float_maxpool(t, self.buffers[o.tensor], win))
        return BoundStep(step, launches, f"{how} + netops epilogue + max-pool")

    def _bind_maxpool(self, step: MaxPool) -> BoundStep:
        netops, _, _ = _triton()
        w = step.window
        if self.plan.tensors[step.input].is_float:
            return BoundStep(step, [float_maxpool(self.buffers[step.input],
                                                   self.buffers[step.output], w)], "torch")
        return BoundStep(step, [netops.bind_maxpool2d(
            self.packed(step.input), self.packed(step.output), w.kernel, w.stride, w.pad,
            w.ceil)],
            "netops max-pool")

    def _bind_avgpool(self, step: AvgPool) -> BoundStep:
        netops, _, _ = _triton()
        x, out = self.buffers[step.input], self.buffers[step.output]
        if self.plan.tensors[step.output].is_float:
            def launch() -> None:
                if step.mode == WINDOW:
                    y = F.avg_pool2d(x, step.kernel, step.stride, step.pad)
                elif step.mode == GLOBAL:
                    y = x.mean(dim=(2, 3), keepdim=True)
                else:
                    y = F.adaptive_avg_pool2d(x, step.output_hw)
                out.copy_(y.clamp_min(0) if step.relu else y)

            return BoundStep(step, [launch], "torch")
        m, s = self.plan.params[step.multiplier], self.plan.params[step.shift]
        xp, op = self.packed(step.input), self.packed(step.output)
        whole_map = step.mode == GLOBAL or (step.mode == ADAPTIVE and step.output_hw == (1, 1))
        if (step.mode == WINDOW or whole_map) and len(step.counts) == 1:
            kernel = None if whole_map else step.kernel
            return BoundStep(step, [netops.bind_avgpool2d(xp, op, kernel, step.stride,
                                                          step.pad, m[0], s[0], step.relu)],
                             "netops average pool")
        _, h, w, _ = xp.shape
        oh, ow = step.output_hw or (None, None)
        rows = axis_windows(h, step.mode, step.kernel, step.stride, step.pad, oh)
        cols = axis_windows(w, step.mode, step.kernel, step.stride, step.pad, ow)
        return BoundStep(step, [netops.bind_avgpool_windows(xp, op, rows, cols, step.counts,
                                                            m, s, step.relu)],
                         "netops window-table average pool")

    def _flatten_view(self, step: Flatten) -> None:
        spec, src = self.plan.tensors[step.input], self.buffers[step.input]
        out = self.plan.tensors[step.output]
        if spec.is_float or spec.is_wide or spec.layout is Layout.INT8:
            view = src.reshape(src.shape[0], -1)
        else:
            _, h, w, c = spec.shape if len(spec.shape) == 4 else (0, 1, 1, spec.shape[-1])
            if c % 32 and h * w > 1:
                raise ValueError(f"{step.name}: flattening bit planes of {c} channels (not a "
                                 "multiple of 32) over a map would need a re-layout")
            view = src.reshape(src.shape[0], src.shape[1], -1)
        if tuple(view.shape) != tuple(out.storage_shape):
            raise AssertionError(f"{step.name}: flatten view {tuple(view.shape)} != "
                                 f"{out.storage_shape}")
        self.buffers[step.output] = view

    # ------------------------------------------------------------------ running
    def check_input(self, x: object) -> torch.Tensor:
        spec = self.plan.input_spec
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if self.plan.input_dtype == torch.uint8 and x.dtype != torch.uint8:
            raise TypeError(f"x must be a uint8 image (the plan reads pixel values), got "
                            f"{x.dtype}")
        if self.plan.input_dtype != torch.uint8 and not x.dtype.is_floating_point:
            raise TypeError(f"x must have a floating-point dtype, got {x.dtype}")
        if tuple(x.shape) != tuple(spec.shape):
            raise ValueError(f"x must have the plan's input shape {tuple(spec.shape)}, got "
                             f"{tuple(x.shape)}")
        if x.device != self.device:
            raise ValueError(f"x is on {x.device}, the executor on {self.device}")
        return x

    def run_steps(self) -> None:
        """Every launch of the forward in order (what the CUDA graph holds)."""
        self.status.zero_()
        for step in self.steps:
            if not step.record_only:
                step()

    def capture(self) -> None:
        """Eager warm-up (compiles every kernel), then capture the forward as a CUDA graph."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.run_steps()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.run_steps()
        self.graph = graph

    def replay(self) -> None:
        """One forward on the input buffer's contents (graph replay, or eager)."""
        if self.use_graph:
            if self.graph is None:
                self.capture()
            self.graph.replay()
        else:
            self.run_steps()

    def _raise_if_nonfinite(self) -> None:
        if self.check_finite and int(self.status[0]):
            raise ValueError("x has non-finite values (inf or nan)")

    @property
    def input_buffer(self) -> torch.Tensor:
        """The image buffer the forward reads: an input written into it in place and passed
        as x is not copied again (the copy is ~15 us of host time per call on an H100 host,
        `host_probe`)."""
        return self.buffers[self.plan.input]

    def __call__(self, x: torch.Tensor, record: bool = False, copy_output: bool = True
                 ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The logits of x (float32). copy_output=False returns the engine's own output
        buffer, which the next forward overwrites (no clone: ~15-19 us of host time)."""
        x = self.check_input(x)
        buf = self.buffers[self.plan.input]
        if not (x.data_ptr() == buf.data_ptr() and x.dtype == buf.dtype
                and x.stride() == buf.stride()):
            buf.copy_(x)
        if capturing(self.device):
            # inside the caller's capture: the launches join the caller's graph (this graph's
            # replay would invalidate the capture) and the status is not read (a device sync)
            if record:
                raise ValueError("record=True reads every tensor back: not inside a CUDA "
                                 "graph capture")
            self.run_steps()
            return self.result.clone() if copy_output else self.result
        if record:
            return self._record()
        self.replay()
        self._raise_if_nonfinite()
        return self.result.clone() if copy_output else self.result

    def _record(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        recorded: dict[str, torch.Tensor] = {}
        self.status.zero_()
        for step in self.steps:
            step()
            for t in step.step.outputs:
                recorded[t] = self.buffers[t].clone()
        self._raise_if_nonfinite()
        return self.result.clone(), recorded

    def implementations(self) -> dict[str, str]:
        """{step name: what runs it} (stems, kernels, epilogue passes, fallbacks)."""
        return {b.name: ("not run (fused into the stem) " if b.record_only else "") + b.how
                for b in self.steps}


def capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream of `device` is being captured into a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def gpu_executor(plan: Plan, device: torch.device) -> GpuExecutor:
    """`EXECUTORS["gpu"]` factory: a GpuExecutor with the defaults."""
    return GpuExecutor(plan, device)

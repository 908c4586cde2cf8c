"""A compiled model inside the caller's graphs: as a custom op in `torch.compile`d code (one
opaque node, fullgraph), and (GPU) inside the caller's own CUDA graph capture."""

from __future__ import annotations

import warnings

import pytest
import torch

import lowbit
from engine_cases import calibrated
from lowbit.runtime.compiled import compile_model


@pytest.fixture(scope="module")
def compiled():
    q, x = calibrated("digits_resnet", "w2a2", seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_model(q, x[:2], records=False), x[2:4]


def test_as_op_runs_inside_torch_compile_fullgraph(compiled):
    cm, x = compiled
    op = cm.as_op()
    head = torch.nn.Linear(10, 3)

    def detector(images: torch.Tensor) -> torch.Tensor:
        return head(op(images).softmax(1))

    fn = torch.compile(detector, backend="aot_eager", fullgraph=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, want = fn(x), head(cm(x).softmax(1))
    assert torch.equal(got, want)
    assert op._qualname.startswith("lowbit::compiled_")
    assert cm.as_op()._qualname != op._qualname  # a fresh name per call
    with pytest.raises(Exception, match="must have the compiled shape"):  # dynamo wraps it
        torch.compile(detector, backend="aot_eager", fullgraph=True)(torch.cat([x, x]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_model_inside_the_callers_cuda_graph():
    """The caller captures backbone + head in one CUDA graph; each replay on new images in
    the caller's static input equals the eager call; before a first eager call, capture is
    refused with its reason."""
    q, x = calibrated("resnet18", "w1a2", seed=5, size=(32, 32))
    x = x.cuda()
    cm = lowbit.compile(q.cuda(), x[:2], records=False)
    assert cm.executor == "gpu"
    static = x[:2].clone()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="outside the capture"), torch.cuda.graph(graph):
        cm(static)
    want = cm(static)  # the first call, outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cm(static).softmax(1)
    graph.replay()
    assert torch.equal(out, want.softmax(1))
    static.copy_(x[2:4])
    graph.replay()
    assert torch.equal(out, cm(x[2:4]).softmax(1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_as_op_under_reduce_overhead():
    q, x = calibrated("resnet18", "w1a2", seed=6, size=(32, 32))
    x = x.cuda()
    cm = lowbit.compile(q.cuda(), x[:2], records=False)
    op = cm.as_op()
    def head(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = op(images)
        return logits, logits.softmax(1)

    fn = torch.compile(head, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):  # warm-up, record, replay
            logits, probs = fn(x[:2].clone())
        want = cm(x[:2])
    # the op's logits are the engine's, bit for bit; Inductor's fused softmax rounds in its
    # own order (float32: a few ulps from eager's, as measured on an H100)
    assert torch.equal(logits, want)
    torch.testing.assert_close(probs, want.softmax(1), rtol=1e-5, atol=1e-6)

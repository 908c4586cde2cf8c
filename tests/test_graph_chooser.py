"""The plan carries every kernel decision (`lowbit.graph.chooser`, `lowbit.graph.launches`):
each layer's template, config and its source (tuned records, the performance model, the
default), chosen once at plan time; launch decisions in the plan; saved with the compiled
model and shown by its summary."""

from __future__ import annotations

import warnings

import pytest
import torch

import lowbit
from engine_cases import calibrated
from lowbit.core import Config
from lowbit.graph import Chooser, Layer, ModelChooser, PlanOptions, make_chooser
from lowbit.graph.chooser import DEFAULT, PREDICTED, TUNED, default_kernel
from lowbit.graph.impl import TORCH_FP16, is_bitserial
from lowbit.graph.launches import with_launches
from lowbit.kernels import get_template
from lowbit.runtime.compiled import compile_model
from lowbit.tune.dispatch import outside_model_data
from lowbit.tune.records import Record, RecordsDB

GPU = "NVIDIA H100 80GB HBM3"


def _compile(q, x, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return compile_model(q, x, executor="reference", **kw)


@pytest.fixture(scope="module")
def resnet():
    return calibrated("resnet18", "mixed", seed=3, width=0.125)


def _other_config(layer: Layer) -> Config:
    """A valid config of the layer's template other than its own."""
    space = get_template(layer.impl).space(layer.workload, arch="sm_90a") \
        if is_bitserial(layer.impl) else get_template(layer.impl).space(layer.workload)
    for cfg in space.neighbors(layer.config):
        if cfg != layer.config:
            return cfg
    raise AssertionError(f"{layer.name}: no other config")


def _fused_bitserial(plan) -> Layer:
    return next(s for s in plan.layers
                if is_bitserial(s.impl) and s.workload.epilogue.requantizes)


def test_untuned_plan_runs_each_templates_default(resnet):
    q, x = resnet
    plan = _compile(q, x, records=False).plan
    checked = 0
    for s in plan.layers:
        assert s.config_source == DEFAULT, s.name
        if s.impl == TORCH_FP16:
            assert s.config is None
            continue
        want = default_kernel(s.workload, s.impl)
        assert (s.impl, s.config) == (want.template, want.config), s.name
        checked += 1
    assert checked == len(plan.layers) >= 20


def test_recorded_best_reaches_the_plan(resnet, tmp_path):
    """A record of a layer's final workload (the form the engine runs) becomes that layer's
    config, tagged with the GPU it was measured on; the others keep their defaults; a slower
    record of another config loses to the faster one; records of another GPU count only
    when the plan names none."""
    q, x = resnet
    base = _compile(q, x, records=False).plan
    target = _fused_bitserial(base)
    fast, slow = _other_config(target), target.config
    db_path = tmp_path / "records.sqlite"
    with RecordsDB(db_path) as db:
        for cfg, us in ((fast, 10.0), (slow, 12.0)):
            db.add(Record(target.workload.key, target.impl, cfg.to_json(), us, None, GPU))
    plan = _compile(q, x, records=db_path).plan
    layer = next(s for s in plan.layers if s.name == target.name)
    assert (layer.config, layer.config_source) == (fast, TUNED)
    assert GPU in layer.config_reason and "10.0 us" in layer.config_reason
    same = [s for s in plan.layers if s.workload == target.workload]
    assert all((s.config, s.config_source) == (fast, TUNED) for s in same)
    others = [s for s in plan.layers if s.workload != target.workload]
    assert others and all(s.config_source == DEFAULT for s in others)
    assert plan.config_sources() == {TUNED: len(same), DEFAULT: len(others)}
    # the chooser of a plan for another GPU ignores this GPU's records
    other = Chooser(db_path, gpu="NVIDIA A100-SXM4-80GB")
    assert other.recorded(target.workload, target.impl) is None
    assert Chooser(db_path, gpu=GPU).recorded(target.workload, target.impl).config == fast


def test_records_by_default_from_the_users_database(resnet, tmp_path, monkeypatch):
    q, x = resnet
    base = _compile(q, x, records=False).plan
    target = _fused_bitserial(base)
    path = tmp_path / "user.sqlite"
    monkeypatch.setenv("LOWBIT_RECORDS", str(path))
    assert all(s.config_source == DEFAULT for s in _compile(q, x).plan.layers)  # no file yet
    with RecordsDB(path) as db:
        db.add(Record(target.workload.key, target.impl, _other_config(target).to_json(), 5.0,
                      None, GPU))
    tuned = [s.workload for s in _compile(q, x).plan.layers if s.config_source == TUNED]
    assert tuned and set(tuned) == {target.workload}
    assert all(s.config_source == DEFAULT for s in _compile(q, x, records=False).plan.layers)


def test_model_chooser_predicts_configs(resnet):
    q, x = resnet
    plan = _compile(q, x, chooser="model", records=False).plan
    sources = [s.config_source for s in plan.layers
               if s.impl != TORCH_FP16 and not outside_model_data(s.workload)]
    assert len(sources) >= 10 and all(src == PREDICTED for src in sources), sources
    for s in plan.layers:
        if s.impl != TORCH_FP16:
            assert get_template(s.impl).supports(s.workload), s.name
    assert isinstance(make_chooser("model"), ModelChooser)


def test_model_chooser_keeps_the_measured_implementations(resnet):
    """The model picks configs, never the implementation: every layer runs on the default
    plan's kind of kernel (bit-serial family, int8 template or PyTorch fp16) with the same
    operand layouts and fused outputs; only template-within-group and config may differ."""
    q, x = resnet
    default = _compile(q, x, records=False).plan
    model = _compile(q, x, chooser="model", records=False).plan
    assert [s.name for s in model.layers] == [s.name for s in default.layers]

    def kind(s: Layer) -> str:
        return "fp16" if s.impl == TORCH_FP16 else "bitserial" if is_bitserial(s.impl) else s.impl

    for a, b in zip(default.layers, model.layers, strict=True):
        assert (kind(b), b.workload.key) == (kind(a), a.workload.key), a.name
        assert [o.tensor for o in b.layer_outputs] == [o.tensor for o in a.layer_outputs]
    assert len(default.layers) >= 15
    assert sum(kind(s) == "bitserial" for s in model.layers) >= 10


def test_model_chooser_leaves_block_ends_to_their_defaults():
    """The performance model never measured a block-end epilogue (a residual read in the
    32-bit epilogue, derived outputs): those layers keep their default config, saying why;
    the rest are predicted."""
    torch.manual_seed(4)
    m = lowbit.models.get("resnet18", num_classes=10, width=0.125).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = lowbit.quantize(m, weight_bits=1, act_bits=2, residual_bits=8)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    lowbit.calibrate(q, [x])
    plan = _compile(q, x, chooser="model", records=False).plan
    ends = [s for s in plan.layers if s.workload.epilogue.requant32]
    rest = [s for s in plan.layers if s not in ends and s.impl != TORCH_FP16]
    assert len(ends) >= 7 and len(rest) >= 8, (len(ends), len(rest))
    for s in ends:
        assert s.config_source == DEFAULT, s.name
        assert "no measurements of block-end epilogues" in s.config_reason, s.config_reason
        want = default_kernel(s.workload, s.impl)
        assert (s.impl, s.config) == (want.template, want.config), s.name
    assert all(s.config_source == PREDICTED for s in rest), [s.name for s in rest]


def test_chooser_arguments_are_checked(resnet):
    with pytest.raises(ValueError, match="chooser must be one of"):
        make_chooser("fastest")
    with pytest.raises(TypeError, match="chooser must be one of"):
        make_chooser(3)
    with pytest.raises(TypeError, match="records must be"):
        Chooser(records=3)
    with pytest.raises(TypeError, match="options must be a"):
        compile_model(*resnet, options={"chain": False})
    with pytest.raises(TypeError, match="records must be"):
        compile_model(*resnet, records=3)


def test_saved_plan_keeps_its_kernel_decisions(resnet, tmp_path):
    """The compiled model's plan (configs, sources, launch decisions) survives save / load: a
    deployed model runs its tuned configs without the database."""
    q, x = resnet
    base = _compile(q, x, records=False).plan
    target = _fused_bitserial(base)
    db_path = tmp_path / "records.sqlite"
    with RecordsDB(db_path) as db:
        db.add(Record(target.workload.key, target.impl, _other_config(target).to_json(), 3.0,
                      None, GPU))
    cm = _compile(q, x, records=db_path)
    path = tmp_path / "compiled.safetensors"
    lowbit.save(cm, path)
    loaded = lowbit.load(path)
    before = {s.name: (s.impl, s.config, s.config_source, s.stem, s.chained,
                       s.outputs_in_kernel) for s in cm.plan.layers}
    after = {s.name: (s.impl, s.config, s.config_source, s.stem, s.chained,
                      s.outputs_in_kernel) for s in loaded.plan.layers}
    assert after == before and after[target.name][2] == TUNED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(loaded(x), cm(x))


def test_launch_decisions_are_in_the_plan(resnet):
    q, x = resnet
    plan = _compile(q, x, records=False).plan
    first = plan.layers[0]
    assert first.stem and not first.chained
    chained = [s for s in plan.layers if s.chained]
    assert chained and all(is_bitserial(s.impl) for s in chained)
    off = with_launches(plan, PlanOptions(fuse_stem=False, chain=False, fuse_outputs=False))
    assert not any(s.stem or s.chained or s.outputs_in_kernel for s in off.layers)
    assert len(chained) == sum(is_bitserial(s.impl) and not s.stem for s in plan.layers)


def test_summary_shows_configs_and_their_sources(resnet):
    q, x = resnet
    cm = _compile(q, x, records=False)
    text = cm.summary()
    assert "kernel config" in text and "triton bands stem" in text
    n = sum(s.config_source == DEFAULT for s in cm.plan.layers)
    assert f"kernel configs: {DEFAULT} {n}" in text

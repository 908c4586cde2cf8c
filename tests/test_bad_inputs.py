"""Property-based: the public API (`lowbit.quantize`, `calibrate`, `convert`, `compile`,
`save`, `load`, `summary`) and the CLI, driven with bad paths, shapes, dtypes, files and
arguments, answer with a ValueError / TypeError / FileNotFoundError whose message names the
argument (or the file), or a CLI error line and exit code 2 / 3, never anything else."""

from __future__ import annotations

import re
import string
import warnings

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn
from typer.testing import CliRunner

import lowbit
from lowbit.cli import app

ACCEPTED = (ValueError, TypeError, FileNotFoundError)
FAST = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])


def _net() -> nn.Module:
    torch.manual_seed(0)
    return lowbit.models.get("digits_cnn", num_classes=10, width=0.5)


def _x(shape=(2, 1, 8, 8), seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def clear_error(call, *names: str) -> BaseException | None:
    """Run `call`: it may succeed (None); if it raises, the exception must be one of ACCEPTED
    and its message must contain one of `names`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
    except ACCEPTED as e:
        assert any(n in str(e) for n in names), (type(e).__name__, str(e), names)
        return e
    return None


def must_refuse(call, *names: str) -> BaseException:
    e = clear_error(call, *names)
    assert e is not None, f"accepted a bad input (expected an error naming {names})"
    return e


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A calibrated fake-quant model, its converted model and files of both and of a compiled
    model."""
    warnings.simplefilter("ignore")
    root = tmp_path_factory.mktemp("models")
    q = lowbit.quantize(_net(), weight_bits=2, act_bits=2)
    lowbit.calibrate(q, [_x(seed=s) for s in range(2)])
    c = lowbit.convert(q)
    files = {"fakequant": lowbit.save(q, root / "fq.safetensors"),
             "converted": lowbit.save(c, root / "cv.safetensors"),
             "compiled": lowbit.save(lowbit.compile(c, _x()), root / "cm.safetensors")}
    return {"q": q, "c": c, "files": files, "root": root}


NOT_MODELS = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.floats(),
                       st.just(torch.zeros(2)), st.just([nn.Linear(2, 2)]))
FILE_NAMES = st.text(alphabet=string.ascii_letters + string.digits + " _-.\x00", min_size=1,
                     max_size=12)
DTYPES = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16,
                          torch.int64, torch.int8, torch.uint8, torch.bool])
SHAPES = st.lists(st.integers(0, 9), min_size=0, max_size=5).map(tuple)


def _tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)))
    return x.to(dtype)


# ----------------------------------------------------------------------------- models

@FAST
@given(model=NOT_MODELS)
def test_every_entry_point_names_a_model_that_is_none(model):
    for fn in (lambda: lowbit.quantize(model), lambda: lowbit.calibrate(model, [_x()]),
               lambda: lowbit.convert(model), lambda: lowbit.compile(model, _x()),
               lambda: lowbit.summary(model, show=False)):
        must_refuse(fn, "model")


def test_float_models_are_refused_by_name():
    for fn in (lambda: lowbit.calibrate(_net(), [_x()]), lambda: lowbit.convert(_net()),
               lambda: lowbit.compile(_net(), _x()), lambda: lowbit.save(_net(), "x.st")):
        must_refuse(fn, "model", "lowbit layers", "Sequential")


# ----------------------------------------------------------------------------- quantize

BITS = st.one_of(st.integers(-3, 12), st.floats(allow_nan=True), st.text(max_size=3),
                 st.none(), st.booleans())


@FAST
@given(weight_bits=BITS, act_bits=BITS,
       method=st.one_of(st.sampled_from(["max", "lsq", "rand"]), st.text(max_size=6),
                        st.none(), st.integers()),
       layers=st.one_of(st.none(), st.integers(),
                        st.dictionaries(st.sampled_from(["0", "3", "zz", "*"]),
                                        st.one_of(st.integers(), st.fixed_dictionaries(
                                            {"weight_bits": BITS})), max_size=2)),
       skip=st.one_of(st.none(), st.integers(), st.lists(st.sampled_from(["0", "zz", 3]),
                                                         max_size=2)))
def test_quantize_names_its_bad_argument(weight_bits, act_bits, method, layers, skip):
    names = ("weight_bits", "act_bits", "method", "layers", "skip")
    kw = {"weight_bits": weight_bits, "act_bits": act_bits, "method": method,
          "layers": layers}
    if skip is not None:
        kw["skip"] = skip
    clear_error(lambda: lowbit.quantize(_net(), **kw), *names)


# ----------------------------------------------------------------------------- data

@FAST
@given(shape=SHAPES, dtype=DTYPES, wrap=st.sampled_from(["list", "tuple", "bare"]))
def test_calibrate_names_the_loader_for_bad_batches(shape, dtype, wrap):
    x = _tensor(shape, dtype)
    loader = {"list": [x], "tuple": [(x, torch.zeros(1))], "bare": x}[wrap]
    q = lowbit.quantize(_net(), weight_bits=4, act_bits=4)
    e = clear_error(lambda: lowbit.calibrate(q, loader), "loader")
    if wrap == "bare" or dtype != torch.float32 or len(shape) != 4 or shape[1] != 1:
        assert e is not None, (wrap, shape, dtype)


@FAST
@given(shape=SHAPES, dtype=DTYPES, kind=st.sampled_from(["q", "c"]))
def test_compile_names_example_input_for_bad_batches(models, shape, dtype, kind):
    x = _tensor(shape, dtype)
    e = clear_error(lambda: lowbit.compile(models[kind], x), "example_input")
    if len(shape) != 4 or 0 in shape or not dtype.is_floating_point or shape[1] != 1:
        assert e is not None, (shape, dtype)


@FAST
@given(shape=SHAPES, dtype=DTYPES)
def test_a_compiled_model_names_x_for_bad_batches(models, shape, dtype):
    compiled = lowbit.compile(models["c"], _x())
    x = _tensor(shape, dtype)
    e = clear_error(lambda: compiled(x), "x")  # another image size: planned again, runs
    if len(shape) != 4 or 0 in shape or not dtype.is_floating_point or shape[1] != 1:
        assert e is not None, (shape, dtype)


# ----------------------------------------------------------------------------- files

@FAST
@given(path=st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=4),
                      st.just(""), st.just("."), FILE_NAMES))
def test_load_names_a_bad_path(models, path):
    if isinstance(path, str) and path not in ("", "."):
        path = str(models["root"] / "missing" / path)
    must_refuse(lambda: lowbit.load(path), "path", str(path))


@FAST
@given(name=FILE_NAMES, where=st.sampled_from(["missing folder", "folder", "none", "int"]))
def test_save_names_a_bad_path(models, name, where):
    path = {"missing folder": models["root"] / "no" / "such" / name,
            "folder": models["root"], "none": None, "int": 7}[where]
    must_refuse(lambda: lowbit.save(models["c"], path), "path")


@FAST
@given(content=st.binary(max_size=300))
def test_load_names_a_file_that_is_no_model(models, content):
    path = models["root"] / "junk.safetensors"
    path.write_bytes(content)
    must_refuse(lambda: lowbit.load(path), str(path))


@FAST
@given(kind=st.sampled_from(["fakequant", "converted", "compiled"]), data=st.data())
def test_a_damaged_file_is_refused_naming_it_or_loads_unchanged(models, kind, data, tmp_path):
    """Any one byte changed anywhere in a saved file (header, manifest or tensors), or the
    file cut short: a ValueError naming the file, or (a change that means nothing, e.g. JSON
    whitespace) a model with the same outputs."""
    src = models["files"][kind]
    raw = bytearray(src.read_bytes())
    cut = data.draw(st.booleans())
    if cut:
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    else:
        offset = data.draw(st.integers(0, len(raw) - 1))
        raw[offset] ^= data.draw(st.integers(1, 255))
    bad = tmp_path / f"damaged-{kind}.safetensors"
    bad.write_bytes(bytes(raw))
    e = clear_error(lambda: lowbit.load(bad), str(bad))
    if e is None:
        x = _x(seed=5)
        with torch.no_grad():
            assert torch.equal(lowbit.load(bad)(x), lowbit.load(src)(x))


@FAST
@given(answer=st.one_of(st.none(), st.integers(), st.text(max_size=4),
                        st.tuples(st.integers(), st.text(max_size=3)),
                        st.tuples(st.text(max_size=3))))
def test_compile_names_a_choose_impl_that_answers_nonsense(models, answer):
    must_refuse(lambda: lowbit.compile(models["c"], _x(), choose_impl=lambda wl: answer),
                "choose_impl")


@FAST
@given(console=st.one_of(st.integers(), st.text(max_size=3), st.just(object())))
def test_summary_names_a_bad_console(models, console):
    must_refuse(lambda: lowbit.summary(models["q"], console=console), "console")


@FAST
@given(model=st.one_of(NOT_MODELS, st.just(nn.Linear(3, 2)), st.just(lambda a: a)),
       device=st.one_of(st.just("cpu"), st.text(max_size=6), st.integers()))
def test_load_names_bad_model_and_device_arguments(models, model, device):
    path = models["files"]["converted"]
    clear_error(lambda: lowbit.load(path, model=model, device=device), "model", "device",
                "architecture")


# ----------------------------------------------------------------------------- the CLI

def _cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


# (a word starting with "-" is an option to typer's parser, which has its own usage errors)
WORDS = st.text(alphabet=string.ascii_letters + string.digits + "_-.:/", min_size=1,
                max_size=10).filter(lambda w: not w.startswith("-"))


@st.composite
def bad_command(draw) -> tuple[list[str], tuple[str, ...]]:
    """(a command line with one bad argument, what its error must name)."""
    word = draw(WORDS)
    kind = draw(st.sampled_from(["precision", "model", "summary", "trials", "top", "strategy",
                                 "device", "bench-model", "bench-batch", "report", "layers",
                                 "weights"]))
    if kind == "precision":
        assume(not re.fullmatch(r"w[1-8]a[1-8]", word))
        return ["quantize", "digits_cnn", "--random-weights", "--precision", word], (word,)
    if kind == "model":
        assume(word not in lowbit.models.names())
        return ["quantize", word, "--random-weights"], (word.rpartition(":")[0] or word,)
    if kind == "summary":
        return ["summary", f"/no/such/{word}.safetensors"], (word,)
    if kind == "trials":
        n = draw(st.integers(-5, 0))
        return ["tune", "--model", "digits_cnn", "--trials", n], ("--trials",)
    if kind == "top":
        n = draw(st.integers(-5, -1))
        return ["tune", "--model", "digits_cnn", "--top", n], ("--top",)
    if kind == "strategy":
        assume(word not in ("random", "exhaustive", "sa", "diversity", "tpe", "pruned"))
        return ["tune", "--model", "digits_cnn", "--strategy", word], ("--strategy",)
    if kind == "device":
        assume(not re.fullmatch(r"cpu|cuda(:\d+)?", word))
        return ["tune", "--model", "digits_cnn", "--device", word], ("--device",)
    if kind == "bench-model":
        assume(word not in lowbit.models.names())
        return ["bench", word], (word,)
    if kind == "bench-batch":
        return ["bench", "digits_cnn", "--batch", draw(st.integers(-3, 0))], ("--batch",)
    if kind == "report":
        return ["report", "--results", f"/no/such/{word}"], (word,)
    if kind == "layers":
        return ["quantize", "digits_cnn", "--random-weights", "--layers", f"{word}=w9a9"], \
            ("--layers",)
    return ["quantize", "digits_cnn", "--weights", f"/no/such/{word}.pt"], (word,)


@FAST
@given(case=bad_command())
def test_the_cli_names_the_bad_argument_in_one_line(case):
    args, names = case
    result = _cli(*args)
    assert result.exit_code in (2, 3), (args, result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [ln for ln in result.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, (args, result.output)
    if result.exit_code == 2:
        assert any(n in errors[0] for n in names), (args, errors[0], names)
    else:
        assert "CUDA GPU" in errors[0]

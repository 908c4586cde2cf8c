"""The command line: `lowbit demo` is the README's main job."""

from typer.testing import CliRunner

from lowbit.cli import app


def test_demo_prints_the_precision_table():
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    for name in ("s8", "u4", "b1", "packed B", "fp16 B"):
        assert name in result.output
    # every row of the table has an error and a byte ratio below 1
    assert "0.062x" in result.output  # w1a1 bit planes are 1/16 of fp16 bytes


def test_unknown_command_fails_cleanly():
    result = CliRunner().invoke(app, ["frobnicate"])
    assert result.exit_code != 0


def test_demo_error_falls_with_bits():
    from lowbit.demo import demo_rows

    rows = {(str(r.w), str(r.a)): r for r in demo_rows(0)}
    errs = [rows[k].rel_l2_error for k in (("s8", "u8"), ("s4", "u4"), ("s2", "u2"))]
    assert errs == sorted(errs) and errs[0] < 0.02

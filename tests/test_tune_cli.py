"""`lowbit tune` over a workload file, on the CPU with a fake template."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from lowbit.cli import app
from lowbit.kernels.base import get_template, register
from lowbit.tune import RecordsDB
from test_tune_fakes import TINY, FakeConvTemplate


def test_tune_command_writes_records_and_prints_table(tmp_path):
    try:
        get_template("fake.cli")
    except ValueError:
        register(FakeConvTemplate(modes=("ok", "wrong"), tiles=(1, 2), name="fake.cli"))
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps([{"name": "tiny", **TINY.to_dict()}]))
    db = tmp_path / "r.sqlite"
    out = CliRunner().invoke(app, ["tune", str(layers), "--trials", "3", "--strategy", "random",
                                   "--db", str(db), "--template", "fake.cli",
                                   "--device", "cpu", "--batch", "3"])
    assert out.exit_code == 0, out.output
    assert "tiny" in out.output and "fake.cli" in out.output
    with RecordsDB(db) as rdb:
        assert len(rdb.records(TINY)) == 3
        assert rdb.best(TINY).cfg["mode"] == "ok"

"""The consolidated measurement dataset (`lowbit.perfmodel.dataset.consolidate`, read by
`load_results`) and benchmarks/consolidate.py's citation rule: folding a results file into the
dataset and deleting it changes nothing that `load_results` or `paired_graph_offsets` give."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from lowbit.core import ConvWorkload, Epilogue
from lowbit.kernels.cuda import LEGACY
from lowbit.perfmodel.consolidated import (
    CONSOLIDATED,
    ConsolidatedFile,
    read_consolidated,
    write_consolidated,
)
from lowbit.perfmodel.dataset import (
    consolidate,
    load_results,
    paired_graph_offsets,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import consolidate as script  # noqa: E402

BITS = ConvWorkload(N=2, H=8, W=8, C=64, K=64, R=3, S=3, pad=1, w="b1", a="u2",
                    w_layout="bitplane", a_layout="bitplane",
                    epilogue=Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane"))
IGEMM = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3,
         "GROUP_M": 1, "LOOP_ORDER": "rsc", "SPLIT_K": 1, "SPLIT_SUM": "second_kernel"}
BIT_CFG = {"BM": 64, "BN": 64, "WM": 32, "WN": 32, "KT": 2, "STAGES": 3, "MMA": "mma_sync",
           "PERSIST": 0}
FILES = {
    # a bit-serial run: the workload key of the name "x" at w1a2 comes from its row
    "gpu-a/bitserial-20261123-100000.json": {
        "benchmark": "bitserial", "gpu": "G", "date": "2026-11-23",
        "versions": {"torch": "2.11"}, "rows": [{
            "workload": "x", "precision": "w1a2", "impl": LEGACY, "workload_key": BITS.key,
            "verified": True, "config": BIT_CFG, "time_us": 5.0,
            "tried": [{"config": {**BIT_CFG, "PERSIST": 1}, "us": 6.0, "exact": True}],
            "baselines_us": {"cudnn_fp16": 20.0}, "baseline_configs": {}}]},
    # a later conv run that names its layer only ("x" at w1a2): resolved through that key;
    # events and CUDA-graph times of one config make a graph-offset pair
    "gpu-a/conv-20261124-100000.json": {
        "benchmark": "conv", "gpu": "G", "rows": [{
            "workload": "x", "precision": "w1a2", "impl": "triton.conv2d_int8",
            "config": IGEMM, "time_us": 9.5, "cuda_graph_us": {"triton": 5.5},
            "baselines_us": {"cudnn_fp16": 7.0}}]},
    "gpu-b/tables-20261122-100000.json": {
        "benchmark": "tuning_tables", "gpu": "H", "template": "triton.conv2d_int8",
        "layers": [{"wl": BITS.replace(w="s8", a="s8", w_layout="int8", a_layout="int8",
                                       epilogue=Epilogue(bias=True, relu=True, out="s8")
                                       ).to_dict(),
                    "table": [[IGEMM, 10.0, None], [{**IGEMM, "num_stages": 2}, None, "wrong"]]}]},
}


def _tree(root: Path) -> Path:
    for name, doc in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(json.dumps(doc))
    return root


def _rows(root: Path) -> list[dict]:
    return [m.to_dict() for m in load_results(root, complete=False)]


def test_folding_files_into_the_dataset_changes_no_measurement(tmp_path):
    root = _tree(tmp_path)
    before, offsets = _rows(root), paired_graph_offsets(root)
    assert len(before) == 7 and offsets == [4.0]
    checked = 0
    # fold the file whose key another file needs first, then the others one by one
    for name in FILES:
        records = consolidate(root, [root / name])
        assert [r.path for r in records] == [name]
        kept = [r for r in read_consolidated(root / CONSOLIDATED) if r.path != name]
        write_consolidated(kept + records, root / CONSOLIDATED)
        (root / name).unlink()
        assert _rows(root) == before, name
        assert paired_graph_offsets(root) == offsets, name
        checked += 1
    assert checked == 3 and not list(root.rglob("*.json"))
    records = read_consolidated(root / CONSOLIDATED)
    assert [r.path for r in records] == list(FILES)  # path order
    bits = records[0]
    assert (bits.benchmark, bits.gpu, bits.date, dict(bits.versions), bits.rows) == (
        "bitserial", "G", "2026-11-23", {"torch": "2.11"}, 1)
    assert bits.workload_keys == ((("x", "w1a2"), BITS.key),)
    assert records[2].date == "2026-11-22"  # from the file name where the file has none
    # a file back in the tree replaces its record: no measurement counted twice
    name = "gpu-a/conv-20261124-100000.json"
    (root / name).write_text(json.dumps(FILES[name]))
    assert _rows(root) == before


def test_dataset_bytes_are_deterministic_and_round_trip(tmp_path):
    root = _tree(tmp_path)
    records = consolidate(root, [root / n for n in FILES])
    assert write_consolidated(records, tmp_path / "a.gz") == 7
    write_consolidated(list(reversed(records)), tmp_path / "b.gz")
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()
    assert read_consolidated(tmp_path / "a.gz") == sorted(records, key=lambda r: r.path)
    assert read_consolidated(tmp_path / "missing.gz") == []
    with gzip.open(tmp_path / "a.gz", "rt") as f:
        line = json.loads(f.readline())
    assert {"gpu", "source", "stamp"}.isdisjoint(line["measurements"][0])  # once per file
    other = records[0].measurements[0]
    bad = ConsolidatedFile("gpu-b/x-20261122-100000.json", "x", "H", "", {}, 1, (other,))
    with pytest.raises(ValueError, match="a measurement of"):
        bad.to_dict()


def test_a_file_is_cited_by_the_report_links_or_by_name():
    paths = ["benchmarks/results/g/a-1.json", "benchmarks/results/g/b-1.json",
             "benchmarks/results/g/b-1.png", "benchmarks/results/g/c-1.json",
             "benchmarks/results/g/d-1.json"]
    report = ("|[1.0][1]|\nplots: [b-1.png](benchmarks/results/g/b-1.png)\n\n"
              "[1]: benchmarks/results/g/a-1.json")
    texts = ["NOTES: see `c-1.json`.", "nothing here"]
    assert script.cited(report, texts, paths) == {paths[0], paths[2], paths[3]}
    assert script.cited("", [], paths) == set()

"""benchmarks/probes/ncu_steps.py --summarize (no GPU): Nsight Compute's details CSV and the
probe's order file become one row per profiled kernel, labelled with its plan step in launch
order (a step of two kernels labels two rows), every metric kept with its unit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "probes"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def _row(kid: int, kernel: str, section: str, metric: str, unit: str, value: str) -> str:
    return (f'"{kid}","1","python3","h","{kernel}","1","7","(128, 1, 1)","(396, 1, 1)","0",'
            f'"9.0","{section}","{metric}","{unit}","{value}"')


def test_summarize_labels_kernels_by_step_in_launch_order(tmp_path, monkeypatch):
    import ncu_steps

    csv = tmp_path / "d.csv"
    csv.write_text("\n".join([
        "==PROF== Connected to process 1",  # ncu's own lines come before the table
        HEADER,
        _row(0, "stem_input_kernel", "GPU Speed Of Light Throughput", "Duration", "us", "31.5"),
        _row(1, "stem_conv_kernel", "GPU Speed Of Light Throughput", "Duration", "us", "410.2"),
        _row(1, "stem_conv_kernel", "Occupancy", "Achieved Occupancy", "%", "22.5"),
        _row(2, "bitserial_wgmma", "GPU Speed Of Light Throughput", "DRAM Throughput", "%",
             "61.0"),
    ]) + "\n")
    order = tmp_path / "o.json"
    order.write_text(json.dumps({"case": "resnet50:256:w1a2:res8", "steps": [
        {"step": "layer.conv1", "how": "stem", "launches": 2, "floor_us": 47.2},
        {"step": "layer.layer1_0_conv3", "how": "block end", "launches": 1, "floor_us": 158.4},
    ]}))
    got = ncu_steps.summarize(csv, order)
    rows = got["kernels"]
    assert got["case"] == "resnet50:256:w1a2:res8"
    assert [(r["step"], r["kernel"]) for r in rows] == [
        ("layer.conv1", "stem_input_kernel"), ("layer.conv1", "stem_conv_kernel"),
        ("layer.layer1_0_conv3", "bitserial_wgmma")]
    assert rows[1]["metrics"] == {"GPU Speed Of Light Throughput / Duration": "410.2 us",
                                  "Occupancy / Achieved Occupancy": "22.5 %"}
    assert rows[2]["floor_us"] == 158.4 and rows[2]["grid"] == "(396, 1, 1)"
    assert ncu_steps.case_tag("tv:mobilenet_v2:64:w8a8:int8=-x") == \
        "tv_mobilenet_v2_64_w8a8_int8--x"

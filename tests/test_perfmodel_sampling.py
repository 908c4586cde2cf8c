"""The thesis's sampling model: a line in waves through the 2x / 3x saturation points."""

from __future__ import annotations

import pytest

from lowbit.core import ConvWorkload, GemmWorkload
from lowbit.perfmodel import H100
from lowbit.perfmodel.sampling import (
    WaveLine,
    sampling_predict,
    saturation_batch,
    saturation_workloads,
    slots,
    waves,
    with_batch,
)

CFG = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3,
       "SPLIT_K": 1}
CASES = [("triton.conv2d_int8", ConvWorkload(N=256, H=28, W=28, C=128, K=128, R=3, S=3, pad=1,
                                             w="s8", a="s8"), CFG),
         ("triton.conv2d_int8", ConvWorkload(N=256, H=14, W=14, C=256, K=256, R=3, S=3, pad=1,
                                             w="s8", a="s8"), CFG),
         ("triton.gemm_int8", GemmWorkload(M=8192, N=4096, K=1024, w="s8", a="s8"), CFG)]


def test_wave_line_fit():
    line = WaveLine.fit([(2, 25.0), (3, 35.0), (5, 55.0)])
    assert line.intercept_us == pytest.approx(5.0) and line.slope_us == pytest.approx(10.0)
    assert line.predict(10) == pytest.approx(105.0)
    with pytest.raises(ValueError, match="two distinct"):
        WaveLine.fit([(2, 1.0), (2, 2.0)])


def test_saturation_points_fill_exactly_the_asked_waves():
    checked = 0
    for tmpl, wl, cfg in CASES:
        assert waves(tmpl, wl, cfg, H100) >= 3
        points = saturation_workloads(tmpl, wl, cfg, H100)
        assert [w for _, w in points] == [2, 3]
        for (sample, _), k in zip(points, (2, 3), strict=True):
            batch = sample.N if isinstance(sample, ConvWorkload) else sample.M
            # the largest batch within k waves: one more image (row) spills into wave k + 1
            assert waves(tmpl, with_batch(wl, batch + 1), cfg, H100) >= k or batch == 1
            checked += 1
    assert checked == 6
    assert saturation_batch(*CASES[0], 1, H100) >= 1
    with pytest.raises(ValueError, match="multiple"):
        saturation_batch(*CASES[0], 0, H100)


def test_sampling_predict_extrapolates_a_linear_kernel_exactly():
    calls = []
    for tmpl, wl, cfg in CASES:
        per_wave = 7.0 + slots(tmpl, wl, cfg, H100) / 1000

        def measure(w, tmpl=tmpl, cfg=cfg, per_wave=per_wave):
            calls.append(w)
            return 4.0 + per_wave * waves(tmpl, w, cfg, H100)

        pred = sampling_predict(measure, tmpl, wl, cfg, H100)
        assert pred.predicted_us == pytest.approx(4.0 + per_wave * pred.target_waves)
        assert pred.line.slope_us == pytest.approx(per_wave)
        assert [s[1] for s in pred.samples] == [2, 3]
    assert len(calls) == 2 * len(CASES)


def test_with_batch_rejects_other_workloads():
    assert with_batch(CASES[0][1], 3).N == 3 and with_batch(CASES[2][1], 5).M == 5
    with pytest.raises(TypeError, match="ConvWorkload or GemmWorkload"):
        with_batch(object(), 2)

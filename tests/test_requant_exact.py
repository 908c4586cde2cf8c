"""The planner's exact requantization multipliers (`lowbit.graph.requant`): `reduced` keeps
every output of the formula while lowering its shift, `block_end_shift` gives the block end's
64-bit sum an int32 accumulator multiplier of >= 30 bits."""

from __future__ import annotations

import random

import torch

from lowbit.graph.requant import block_end_shift, reduced, shared_shift


def _formula(acc: int, res: int, m: int, r: int, b: int, s: int) -> int:
    return (acc * m + res * r + b + (1 << (s - 1))) >> s


def test_reduced_keeps_every_output_at_a_smaller_shift():
    """Channels with a common power of two planted in m, r and b (and one without) give the
    same floor((acc m + res r + b + 2^(s-1)) / 2^s) for random accumulators and residuals
    after `reduced`, at shifts lowered by exactly the shared factor (never below 1)."""
    rnd = random.Random(3)
    k = 24
    planted = [rnd.randint(0, 20) for _ in range(k)]
    planted[0] = 0
    s = [max(p + 1, rnd.randint(10, 40)) for p in planted]
    s[1], planted[1] = 5, 9  # the factor passes the shift: reduced to shift 1 at most
    m = [(2 * rnd.randint(1, 2**20) + 1) << p for p in planted]
    r = [(2 * rnd.randint(-2**20, 2**20) + 1) << p for p in planted]
    b = [rnd.randint(-2**30, 2**30) << p for p in planted]
    t = {name: torch.tensor(v, dtype=torch.int64) for name, v in
         (("m", m), ("r", r), ("b", b), ("s", s))}
    m2, r2, b2, s2 = reduced(t["m"], t["r"], t["b"], t["s"])
    # m's trailing zeros are exactly the planted ones: the shared factor, below the shift
    assert s2.tolist() == [sc - min(p, sc - 1) for sc, p in zip(s, planted, strict=True)]
    checked = 0
    for c in range(k):
        for _ in range(200):
            acc, res = rnd.randint(-2**15, 2**15), rnd.randint(-128, 127)
            assert _formula(acc, res, m[c], r[c], b[c], s[c]) == _formula(
                acc, res, int(m2[c]), int(r2[c]), int(b2[c]), int(s2[c]))
            checked += 1
    assert checked == 200 * k
    assert int(s2[0]) == s[0]  # odd multipliers: nothing shared
    assert int(s2[1]) == 1 and sum(int(x) < y for x, y in zip(s2, s, strict=True)) >= k // 2
    m3, r3, b3, s3 = reduced(t["m"], None, t["b"], t["s"])  # no residual term
    assert torch.equal(m3 << (t["s"] - s3), t["m"]) and torch.equal(b3 << (t["s"] - s3), t["b"])
    assert r3 is None and bool((s3 <= t["s"]).all())


def test_block_end_shift_keeps_the_accumulator_multiplier_an_int32():
    """A residual coarser than the accumulator unit (the usual case): shared_shift's pair as
    it is, the accumulator's multiplier 2^30 .. 2^31. A residual finer than it: the shift
    lowered until m_a < 2^31, m_a still >= 2^30, both ratios kept to that precision."""
    a = torch.tensor([3e-3, 0.7, 1.9, 5.5], dtype=torch.float64)
    steps = torch.full((4,), 300.0, dtype=torch.float64)
    m, r, s = block_end_shift(a, 1.3, steps)
    m0, _, s0 = shared_shift(a, 1.3, steps)
    coarse = a < 1.3
    assert torch.equal(m[coarse], m0[coarse]) and torch.equal(s[coarse], s0[coarse])
    assert bool((m >= 2**30).all()) and bool((m < 2**31).all())
    assert int(m0[3]) >= 2**31 and int(s[3]) < int(s0[3])  # what an int32 cannot hold
    for mi, ri, si, ai in zip(m.tolist(), r.tolist(), s.tolist(), a.tolist(), strict=True):
        assert abs(mi / 2**si - ai) <= 2 ** -(si + 1)
        assert abs(ri / 2**si - 1.3) <= 2 ** -(si + 1)

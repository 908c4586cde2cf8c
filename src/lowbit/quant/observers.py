"""Range observers: the clip value ("MAX") a quantizer derives its scale from.

Dao thesis ch. 4, Eq. 4.3-4.5 (our reading): scale = clip / qmax, q = clamp(round_half_up(x /
scale), qmin, qmax); with the MAX method clip = max|x| (max(x) for unsigned tensors). The other
methods only change how clip is chosen:

- max:        clip = the observed maximum magnitude.
- percentile: clip = the given percentile of the magnitudes (e.g. 99.99).
- mse:        clip = argmin over candidates a * max (a in (0, 1]) of the quantization MSE.
- rand:       the thesis' stochastic scale. MAX_new = MAX - U(0, p * MAX), with p chosen per tensor
              from its histogram as the largest fraction such that at most `threshold` of the
              elements (e.g. 1e-5 = 0.001%) fall in [MAX (1 - p), MAX]. Drawn anew every training
              step; evaluation and conversion use the expected value MAX (1 - p / 2).

Activation observers work on a histogram of magnitudes relative to the batch maximum (bins over
[0, 1]), refreshed every `tau` training steps and averaged over the last `eta` refreshes; the
maximum itself is an exponential moving average of batch maxima. Calibration (PTQ) instead
accumulates one histogram over all batches and takes the maximum over all of them.
Weight clips are computed per output channel directly from the weight tensor.
"""

from __future__ import annotations

import torch
from torch import nn

from .quantize import round_half_up

METHODS = ("max", "percentile", "mse", "rand")
_EPS = 1e-12
_MSE_CANDIDATES = torch.linspace(0.05, 1.0, 96, dtype=torch.float64)


def check_method(method: object) -> str:
    """Validate an observer method name."""
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    return method


def magnitudes(x: torch.Tensor, signed: bool) -> torch.Tensor:
    """Flattened float32 magnitudes the range is taken over: |x| if signed, else max(x, 0)."""
    x = x.detach().float().reshape(-1)
    return x.abs() if signed else x.clamp_min(0)


def finite_values(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(finite elements of x, flattened float32; how many were NaN / inf)."""
    x = x.detach().float().reshape(-1)
    ok = torch.isfinite(x)
    bad = x.numel() - int(ok.sum())
    return (x[ok] if bad else x), bad


def relative_histogram(m: torch.Tensor, bins: int) -> tuple[torch.Tensor, float]:
    """(probabilities over `bins` equal bins of [0, 1] of m / max(m), max(m))."""
    top = float(m.max()) if m.numel() else 0.0
    if top <= 0:
        probs = torch.zeros(bins, dtype=torch.float64)
        probs[0] = 1.0
        return probs, 0.0
    counts = torch.histc(m / top, bins=bins, min=0.0, max=1.0).double().cpu()
    return counts / counts.sum().clamp_min(1.0), top


def rebin(probs: torch.Tensor, factor: float) -> torch.Tensor:
    """Histogram over [0, 1] -> the same mass over [0, 1/factor] (factor <= 1 shrinks the range
    of the old bins: bin centres are moved to c * factor)."""
    bins = probs.numel()
    centers = (torch.arange(bins, dtype=torch.float64) + 0.5) / bins * factor
    idx = (centers * bins).floor().long().clamp(0, bins - 1)
    return torch.zeros_like(probs).index_add_(0, idx, probs)


def quantile_from_histogram(probs: torch.Tensor, q: float) -> float:
    """Value in [0, 1] below which a fraction q of the mass lies (linear inside a bin)."""
    probs = probs.detach().double().cpu()
    bins = probs.numel()
    cdf = torch.cumsum(probs, 0)
    total = float(cdf[-1])
    if total <= 0:
        return 1.0
    target = q * total
    i = int(torch.searchsorted(cdf, torch.tensor([target], dtype=cdf.dtype)).item())
    i = min(i, bins - 1)
    below = float(cdf[i - 1]) if i > 0 else 0.0
    inside = float(probs[i])
    frac = 0.0 if inside <= 0 else min(max((target - below) / inside, 0.0), 1.0)
    return (i + frac) / bins


def rand_fraction(probs: torch.Tensor, threshold: float) -> float:
    """p of the Rand scale: the largest fraction of the range whose top [1 - p, 1] holds at most
    `threshold` of the mass (histogram relative to the maximum)."""
    return max(0.0, 1.0 - quantile_from_histogram(probs, 1.0 - threshold))


def mse_fraction(probs: torch.Tensor, qmax: int, qmin: int = 0) -> float:
    """Clip (as a fraction of the maximum) minimizing the expected squared quantization error of
    the magnitudes in the histogram: levels round_half_up(c / s) * s, s = a / qmax."""
    probs = probs.detach().double().cpu()
    bins = probs.numel()
    c = ((torch.arange(bins, dtype=torch.float64) + 0.5) / bins)[None, :]
    a = _MSE_CANDIDATES[:, None]
    s = a / qmax
    lo = qmin if qmin < 0 else 0
    err = (torch.clamp(round_half_up(c / s), lo, qmax) * s - c) ** 2
    return float(_MSE_CANDIDATES[int((err * probs[None, :]).sum(1).argmin())])


class Observer(nn.Module):
    """Tracks the magnitude range of one activation tensor; subclasses turn it into a clip.

    State (buffers: saved with the model, restored by load_state_dict): `top` (maximum
    magnitude), `rel` (averaged relative histogram over [0, 1] of `top`), `seen` (1 once
    anything was observed), `steps` (QAT batches observed), `samples` (elements behind `rel`),
    `nonfinite` (NaN / inf elements skipped), and the window of the last `eta` histograms
    (`recent`, `recent_n`, `refreshes`). Empty batches are not observed (no step).
    """

    def __init__(self, bins: int = 2048, momentum: float = 0.1, tau: int = 10, eta: int = 5,
                 threshold: float = 1e-5, percentile: float = 99.99) -> None:
        super().__init__()
        self.bins, self.momentum, self.tau, self.eta = bins, momentum, tau, eta
        self.threshold, self.percentile = threshold, percentile
        f64, i64 = torch.float64, torch.int64
        self.register_buffer("top", torch.zeros((), dtype=f64))
        self.register_buffer("rel", torch.zeros(bins, dtype=f64))
        self.register_buffer("seen", torch.zeros((), dtype=i64))
        self.register_buffer("steps", torch.zeros((), dtype=i64))
        self.register_buffer("samples", torch.zeros((), dtype=i64))
        self.register_buffer("nonfinite", torch.zeros((), dtype=i64))
        self.register_buffer("recent", torch.zeros(eta, bins, dtype=f64))
        self.register_buffer("recent_n", torch.zeros(eta, dtype=i64))
        self.register_buffer("refreshes", torch.zeros((), dtype=i64))
        self._calib: tuple[torch.Tensor, float] | None = None

    @torch.no_grad()
    def finite(self, m: torch.Tensor) -> torch.Tensor:
        """The finite elements of `m` (flattened); the others are counted in `nonfinite`."""
        m = m.detach().reshape(-1)
        ok = torch.isfinite(m)
        bad = m.numel() - int(ok.sum())
        if bad:
            self.nonfinite += bad
            m = m[ok]
        return m

    @torch.no_grad()
    def observe(self, m: torch.Tensor) -> None:
        """QAT step: EMA of the batch maximum; relative histogram refreshed every tau steps."""
        m = self.finite(m)
        if m.numel() == 0:
            return
        top = float(m.max())
        if int(self.seen) == 0:
            self.top.fill_(top)
        else:
            self.top.mul_(1 - self.momentum).add_(self.momentum * top)
        if int(self.steps) % self.tau == 0:
            slot = int(self.refreshes) % self.eta
            self.recent[slot] = relative_histogram(m, self.bins)[0].to(self.recent.device)
            self.recent_n[slot] = m.numel()
            self.refreshes += 1
            used = min(int(self.refreshes), self.eta)
            self.rel.copy_(self.recent[:used].mean(0))
            self.samples.fill_(int(self.recent_n[:used].sum()))
            self.refreshed()
        self.steps += 1
        self.seen.fill_(1)

    def start_calibration(self) -> None:
        """Forget any calibration in progress; `accumulate` starts a fresh histogram."""
        self._calib = None
        self.samples.zero_()

    @torch.no_grad()
    def accumulate(self, m: torch.Tensor) -> None:
        """Calibration step: one histogram over every batch, range = maximum over all of them."""
        m = self.finite(m)
        if m.numel() == 0:
            return
        probs, top = relative_histogram(m, self.bins)
        weight = float(m.numel())
        self.samples += m.numel()
        if self._calib is None:
            self._calib = (probs * weight, top)
            return
        acc, old = self._calib
        new = max(old, top)
        if new > 0:
            acc = rebin(acc, old / new) + rebin(probs * weight, top / new)
        self._calib = (acc, new)

    def finish_calibration(self) -> None:
        """Turn the accumulated histogram into the frozen range (no-op if nothing was seen)."""
        if self._calib is None:
            return
        acc, top = self._calib
        self.top.fill_(top)
        self.rel.copy_(acc / acc.sum().clamp_min(_EPS))
        self.seen.fill_(1)
        self._calib = None
        self.refreshed()

    def refreshed(self) -> None:
        """Hook: the histogram changed (subclasses update derived state here)."""

    def fraction(self, qmax: int, qmin: int = 0) -> float:
        """Deterministic clip as a fraction of `top`."""
        return 1.0

    def clip(self, qmax: int, qmin: int = 0, stochastic: bool = False) -> float:
        """Clip value (same units as the tensor); stochastic only matters for Rand. 0 when
        only zeros were observed (the caller decides whether that is an error)."""
        return float(self.top) * self.fraction(qmax, qmin)


class MaxObserver(Observer):
    """clip = maximum magnitude (Eq. 4.3)."""


class PercentileObserver(Observer):
    """clip = `percentile` of the magnitudes (histogram estimate)."""

    def fraction(self, qmax: int, qmin: int = 0) -> float:
        return max(quantile_from_histogram(self.rel, self.percentile / 100.0), 1.0 / self.bins)


class MSEObserver(Observer):
    """clip minimizing the quantization MSE of the histogram at the current bit width."""

    def fraction(self, qmax: int, qmin: int = 0) -> float:
        return mse_fraction(self.rel, qmax, qmin)


class RandObserver(Observer):
    """Stochastic scale: clip = MAX - U(0, p MAX) in training, MAX (1 - p/2) otherwise.
    `p` is a buffer (saved with the model); it is capped at 1 - 1/bins so that no draw of the
    clip falls below one histogram bin of the maximum."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.register_buffer("p", torch.zeros((), dtype=torch.float64))

    def refreshed(self) -> None:
        self.p.fill_(min(rand_fraction(self.rel, self.threshold), 1.0 - 1.0 / self.bins))

    def fraction(self, qmax: int, qmin: int = 0) -> float:
        return 1.0 - float(self.p) / 2

    def clip(self, qmax: int, qmin: int = 0, stochastic: bool = False) -> float:
        if not stochastic:
            return super().clip(qmax, qmin)
        u = float(torch.rand(()))
        return float(self.top) * (1.0 - u * float(self.p))


OBSERVERS = {"max": MaxObserver, "percentile": PercentileObserver, "mse": MSEObserver,
             "rand": RandObserver}


def make_observer(method: str, **options: object) -> Observer:
    """Activation observer for `method` (see METHODS)."""
    return OBSERVERS[check_method(method)](**options)


@torch.no_grad()
def channel_clip(w: torch.Tensor, method: str, qmax: int, qmin: int, stochastic: bool = False,
                 threshold: float = 1e-5, percentile: float = 99.99) -> torch.Tensor:
    """Per-output-channel (dim 0) clip of a weight tensor, float32 [K]."""
    m = w.detach().float().reshape(w.shape[0], -1).abs()
    top = m.amax(1).clamp_min(_EPS)
    if method == "max":
        return top
    if method == "percentile":
        return torch.quantile(m, percentile / 100.0, dim=1).clamp_min(_EPS)
    if method == "mse":
        cand = _MSE_CANDIDATES.to(device=m.device, dtype=torch.float32)
        a = cand[:, None, None]
        s = a * top[None, :, None] / qmax
        err = ((torch.clamp(round_half_up(m[None] / s), qmin, qmax) * s - m[None]) ** 2).sum(2)
        return (cand[err.argmin(0)] * top).clamp_min(_EPS)
    # rand: per channel p from the exact tail quantile (capped as RandObserver's)
    q = torch.quantile(m, 1.0 - threshold, dim=1)
    p = (1.0 - q / top).clamp(0.0, 1.0 - 1.0 / 256)
    u = torch.rand_like(p) if stochastic else torch.full_like(p, 0.5)
    return (top * (1.0 - u * p)).clamp_min(_EPS)


"""Optuna's TPE sampler over the knobs, an outside anchor."""

from __future__ import annotations

from collections.abc import Sequence

from ...core import Config, ConfigSpace
from .base import Strategy, Trial


class TPESearch(Strategy):
    """Optuna TPE over the knobs (categorical). Configs the space rejects are told a penalty
    value (TPE learns to avoid them; they cost no measurement); failures are told a penalty
    too. Re-proposals of known configs are answered from memory."""

    name = "tpe"
    PENALTY = 1e12

    def __init__(self, space: ConfigSpace, seed: int = 0, max_asks: int = 8) -> None:
        super().__init__(space, seed)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                             n_startup_trials=10)
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.dists = {k.name: optuna.distributions.CategoricalDistribution(list(k.values))
                      for k in space.knobs}
        self.max_asks = max_asks
        self._trials: dict[Config, object] = {}

    def _value(self, t: float | None) -> float:
        return self.PENALTY if t is None else float(t)

    def _propose(self, n: int) -> list[Config]:
        out: list[Config] = []
        asks = 0
        while len(out) < n and not self.exhausted_with(out) and asks < self.max_asks * n:
            asks += 1
            trial = self.study.ask(self.dists)
            cfg = Config(trial.params)
            if not self.space.is_valid(cfg):
                self.study.tell(trial, self.PENALTY)
            elif cfg in self.measured:
                self.study.tell(trial, self._value(self.measured[cfg]))
            elif cfg in self.pending or cfg in out:
                self.study.tell(trial, state=_fail_state())
            else:
                self._trials[cfg] = trial
                out.append(cfg)
        if len(out) < n:  # TPE keeps re-asking known points: fill with random unseen ones
            out += self._random_unseen(n - len(out), exclude=set(out))
        return out

    def exhausted_with(self, extra: list[Config]) -> bool:
        return len(self.measured) + len(self.pending) + len(extra) >= self._size

    def _learn(self, trials: Sequence[Trial]) -> None:
        for t in trials:
            trial = self._trials.pop(t.config, None)
            if trial is not None:
                self.study.tell(trial, self._value(t.time_us))


def _fail_state():
    import optuna

    return optuna.trial.TrialState.FAIL

"""The learning-rate schedule: linear warm-up to the scaled rate, then cosine decay.

Goyal et al. (https://arxiv.org/abs/1706.02677): with k ranks the global batch is k times
larger, so the rate is k times larger too, but starting there diverges early in training;
ramp from the one-rank rate to k times it over the first epochs. Horovod's
LearningRateWarmupCallback does the same ramp. After the warm-up the rate follows a half
cosine to zero at the last epoch, a smooth form of the paper's step decay that needs no
milestones to tune.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class LearningRateSchedule:
    base_rate: float
    ranks: int
    warmup_epochs: float
    total_epochs: int

    @property
    def peak_rate(self) -> float:
        return self.base_rate * self.ranks

    def rate_at(self, epoch: float) -> float:
        """The rate at a fractional epoch (2.5 is half-way through the third epoch)."""
        # Warm-up ends early when the whole run is shorter than it.
        warmup = min(self.warmup_epochs, float(self.total_epochs))
        if epoch < warmup:
            return self.base_rate + (self.peak_rate - self.base_rate) * epoch / warmup
        decay_span = self.total_epochs - warmup
        if decay_span <= 0:
            return self.peak_rate
        progress = min(1.0, (epoch - warmup) / decay_span)
        return self.peak_rate * 0.5 * (1.0 + math.cos(math.pi * progress))

"""Online measurement of the engine's speed: what GMAX's `EngineSpeed` needs (§4.2, §7: only
"lightweight iteration-level execution time" is monitored, no GPU profiling).

A step that only decodes gives a sample of the step time v_token. A step that also computes prompt
tokens takes longer; the excess over the current decode estimate is attributed to those prompt tokens,
which gives the prefill rate. Both are exponentially weighted so the estimate follows load changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from jitserve.scheduler.gmax import EngineSpeed


@dataclass
class SpeedMeter:
    step_time: float = 0.05  # prior until measured (the GMAX default)
    prefill_tokens_per_s: float = 4000.0
    alpha: float = 0.1  # weight of a new sample
    min_prefill_tokens: int = 64  # smaller prefills do not sample the rate
    decode_samples: int = 0
    prefill_samples: int = 0
    _prefill_tokens: float = 0.0
    _prefill_seconds: float = 0.0

    def observe(self, seconds: float, decode_seqs: int, prefill_tokens: int) -> None:
        """One engine step took `seconds` for `decode_seqs` decoding sequences and `prefill_tokens`."""
        if seconds <= 0 or (decode_seqs == 0 and prefill_tokens == 0):
            return
        if prefill_tokens == 0:
            a = self.alpha if self.decode_samples else 1.0
            self.step_time = (1 - a) * self.step_time + a * seconds
            self.decode_samples += 1
            return
        if prefill_tokens < self.min_prefill_tokens:
            # Admitting a request has a fixed cost (setup, sampling) that tiny prompts would book as
            # prompt work, making the rate look 10-100x too slow; only sizeable chunks measure it.
            return
        # Prompt work: the time beyond a decode step, floored so one noisy step cannot claim an
        # absurd rate; tokens and seconds are averaged separately (a ratio of sums, not of ratios).
        extra = max(seconds - (self.step_time if decode_seqs else 0.0), 0.1 * seconds)
        decay = 1 - self.alpha
        self._prefill_tokens = decay * self._prefill_tokens + prefill_tokens
        self._prefill_seconds = decay * self._prefill_seconds + extra
        self.prefill_tokens_per_s = self._prefill_tokens / self._prefill_seconds
        self.prefill_samples += 1

    def speed(self) -> EngineSpeed:
        return EngineSpeed(step_time=self.step_time, prefill_tokens_per_s=self.prefill_tokens_per_s)

"""Online measurement of the engine's speed: what GMAX's `EngineSpeed` needs (§4.2, §7: only
"lightweight iteration-level execution time" is monitored, no GPU profiling).

`step_time` (v_token) is the time a running request waits for its next token: the wall time of every
step that decodes, whether or not other requests' prompts share it. Under load most steps carry some
prompt work (every admission prefills); sampling decode-only steps alone measured a step the running
requests never saw (176 ms reported, 0.23-0.26 s between a stream's tokens on this machine's stacks
benchmark: docs/decisions/engine.md, "The step GMAX plans with"), so frames overran their plan and the
router admitted work that then ran out of time.

The prefill rate is the excess of a step with sizeable prompt work over a decode-only step, so decode-only
steps keep their own estimate for that subtraction. Every estimate is exponentially weighted so it
follows load changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from jitserve.scheduler.gmax import EngineSpeed


@dataclass
class SpeedMeter:
    step_time: float = 0.05  # v_token: prior until measured (the GMAX default)
    decode_step_time: float = 0.05  # a step with no prompt work: the base the prefill rate is measured over
    prefill_tokens_per_s: float = 4000.0
    alpha: float = 0.1  # weight of a new sample
    min_prefill_tokens: int = 64  # smaller prefills do not sample the rate
    prefix_block_tokens: int = 0  # the engine's prefix-cache block (0: a preempted request keeps nothing)
    step_samples: int = 0
    decode_samples: int = 0
    prefill_samples: int = 0
    _prefill_tokens: float = 0.0
    _prefill_seconds: float = 0.0

    def observe(self, seconds: float, decode_seqs: int, prefill_tokens: int, steps: int = 1) -> None:
        """`steps` engine steps took `seconds` each for `decode_seqs` decoding sequences and
        `prefill_tokens` (the simulator advances runs of identical steps at once; an engine passes 1)."""
        if seconds <= 0 or steps < 1 or (decode_seqs == 0 and prefill_tokens == 0):
            return
        if decode_seqs:
            self.step_time = self._ewma(self.step_time, seconds, self.step_samples, steps)
            self.step_samples += steps
        if prefill_tokens == 0:
            self.decode_step_time = self._ewma(self.decode_step_time, seconds, self.decode_samples, steps)
            self.decode_samples += steps
            return
        if prefill_tokens < self.min_prefill_tokens:
            # Admitting a request has a fixed cost (setup, sampling) that tiny prompts would book as
            # prompt work, making the rate look 10-100x too slow; only sizeable chunks measure it.
            return
        # Prompt work: the time beyond a decode step, floored so one noisy step cannot claim an
        # absurd rate; tokens and seconds are averaged separately (a ratio of sums, not of ratios).
        extra = max(seconds - (self.decode_step_time if decode_seqs else 0.0), 0.1 * seconds)
        decay = 1 - self.alpha
        kept = decay**steps  # `steps` identical samples at once: the geometric sum of their weights
        added = (1 - kept) / self.alpha
        self._prefill_tokens = kept * self._prefill_tokens + added * prefill_tokens
        self._prefill_seconds = kept * self._prefill_seconds + added * extra
        self.prefill_tokens_per_s = self._prefill_tokens / self._prefill_seconds
        self.prefill_samples += steps

    def _ewma(self, estimate: float, sample: float, samples: int, steps: int = 1) -> float:
        if not samples:  # the first sample replaces the prior
            return sample
        return sample + (estimate - sample) * (1 - self.alpha) ** steps

    def speed(self) -> EngineSpeed:
        return EngineSpeed(
            step_time=self.step_time,
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            decode_step_time=self.decode_step_time if self.decode_samples else None,
            prefix_block_tokens=self.prefix_block_tokens,
        )

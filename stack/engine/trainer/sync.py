"""When the loop waits for the device: every `every` steps, about `SECONDS` of device work apart.

A wait is for the step before the newest dispatched one, so the device never idles for it; the
logged rows held since the last wait are completed and emitted then. Waiting at every step
slows a short step, whatever was logged, so the rhythm is set by the device's step time, never by
`trainer.log_every`: a 30 ms step waits every 6 steps, a step of 0.2 s or more at every step
(`bench/log_every.py`).

With several processes the rhythm is fixed instead (`Sync(fixed=trainer.log_every)`: a wait
after each logging step): what a wait completes decides when a non-finite loss stops the run, and
every process must stop at the same step, while the time each one measures differs.
Rounds of several steps or scored on the host wait at round starts instead (stack.engine.trainer.trainer).
"""

SECONDS = 0.2  # device work between two waits
MAX_EVERY = 64  # steps; bounds how far the host runs ahead of the device


class Sync:
    """Counts steps since the last wait; `every` follows the step time measured between waits."""

    def __init__(self, fixed: int | None = None) -> None:
        self.every, self.fixed = fixed or 1, fixed is not None
        self.last: tuple[int, float] | None = None  # (step waited for, clock time then)

    def due(self, step: int) -> bool:
        """Whether the loop waits for `step` (the newest but one dispatched) now."""
        if self.fixed:
            return step % self.every == 0
        return self.last is None or step - self.last[0] >= self.every

    def waited(self, step: int, now: float) -> None:
        """The device finished `step` at `now` (the run's clock: paused spans left out)."""
        if not self.fixed and self.last is not None and step > self.last[0] and now > self.last[1]:
            per_step = (now - self.last[1]) / (step - self.last[0])
            self.every = max(1, min(MAX_EVERY, int(SECONDS / per_step)))
        self.last = (step, now)

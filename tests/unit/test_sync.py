"""The loop's rhythm of waits for the device (stack.engine.trainer.sync), on a hand-made clock."""

from stack.engine.trainer.sync import MAX_EVERY, SECONDS, Sync


def waits(step_seconds: float, steps: int) -> list[int]:
    """The steps a loop waits for when each step takes `step_seconds` of device time."""
    sync, seen = Sync(), []
    for step in range(steps):
        if sync.due(step):
            sync.waited(step, step * step_seconds)
            seen.append(step)
    return seen


def test_waits_fall_about_the_set_seconds_of_device_work_apart():
    # 30 ms steps: every step until one step time is measured, then every int(0.2 / 0.03) = 6
    assert waits(0.03, 20) == [0, 1, 7, 13, 19]
    assert int(SECONDS / 0.03) == 6


def test_slow_steps_wait_every_step_and_fast_ones_at_most_max_every_apart():
    assert waits(0.5, 5) == [0, 1, 2, 3, 4]
    assert waits(1e-5, 200) == [0, 1, 1 + MAX_EVERY, 1 + 2 * MAX_EVERY, 1 + 3 * MAX_EVERY]


def test_the_rhythm_follows_a_change_of_step_time():
    sync = Sync()
    sync.waited(0, 0.0)
    sync.waited(10, 0.1)  # 10 ms steps
    assert sync.every == 20 and not sync.due(29) and sync.due(30)
    sync.waited(30, 4.1)  # then 200 ms steps (e.g. a bigger batch after an eval)
    assert sync.every == 1 and sync.due(31)


def test_a_fixed_rhythm_waits_after_each_logging_step_whatever_the_step_time():
    """Several processes: every one waits (and so may stop on a non-finite loss) at the same steps."""
    sync = Sync(fixed=5)
    for step, now in ((0, 0.0), (5, 0.001), (10, 9.0)):
        assert sync.due(step)
        sync.waited(step, now)
    assert not any(sync.due(step) for step in (1, 4, 6, 9, 11)) and sync.every == 5

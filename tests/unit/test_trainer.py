"""The one trainer: exact gradient accumulation, syncs only when logging, one compile per
program, a typed Summary, old checkpoints refused, and an on-policy toy through the same loop."""

import logging
import os
import signal
import time
from dataclasses import replace
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import stack.engine.trainer.metrics as metrics_hook
from stack.algorithms.base import Schedule, ratio
from stack.algorithms.dpo import DPO as DPOAlgorithm
from stack.algorithms.sft import SFT as SFTAlgorithm
from stack.checkpoint.saved_params import load_params
from stack.engine.step import minibatch, one_program
from stack.engine.trainer import Trainer, train
from stack.engine.trainer.context import PREEMPTED, Hook
from stack.engine.trainer.evaluation import evaluate
from stack.errors import ConfigError
from stack.hardware.mesh import batch_sharding, global_batch
from stack.run.build import build
from tests.helpers import QUICK, captured, loss_of, make_cfg, read_metrics
from tests.unit.toy_reinforce import TARGET, Reinforce

TINY = ["model.d_model=32", "model.n_heads=2", "model.n_kv_heads=1", "model.d_ff=64", "model.n_layers=1",
        "data.batch_size=8", "trainer.eval_batches=1", "logger=jsonl"]
SFT = ["+recipe=llama_sft", "checkpoint=none"]
DPO = ["+recipe=llama_dpo", "checkpoint=none"]


def trained(tmp_path, overrides):
    """(per-step losses, final params) of a 3-step run."""
    tmp_path.mkdir()
    exp, cap = captured(build(make_cfg(overrides + [f"run_dir={tmp_path}"]), str(tmp_path)))
    trainer = Trainer(exp)
    trainer.run()
    losses = [r["train/loss"] for r in cap.rows if "train/loss" in r]
    return losses, jax.tree.map(np.asarray, trainer.state.params)


@pytest.mark.parametrize("recipe", [SFT, DPO], ids=["sft", "dpo"])
def test_grad_accumulation_4x2_equals_one_batch_of_8(tmp_path, recipe):
    """Every token (SFT) or pair (DPO, plus its chosen-NLL term) weighs the same however the
    batch is split: 4 micro-batches of 2 give the 8-row batch's losses and params (fp32). SGD
    (lr 0.1): its step is linear in the gradient, so only the summation order differs; Adam turns
    a rounding difference in a near-zero gradient into an lr-sized step (2e-5 seen at DPO)."""
    base = recipe + QUICK + ["trainer.steps=3", "optimizer=sgd"]
    big_losses, big = trained(tmp_path / "big", base + ["data.batch_size=8", "trainer.grad_accum=1"])
    acc_losses, acc = trained(tmp_path / "acc", base + ["data.batch_size=2", "trainer.grad_accum=4"])
    np.testing.assert_allclose(acc_losses, big_losses, rtol=0, atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-5), acc, big)


class Rounds(Trainer):
    """A Trainer that counts its `collect_update` calls in `fused`; with `split`, it runs every
    round as `collect`, then `update` instead."""

    split = False

    def start(self):
        run = super().start()
        self.fused, one = 0, run.programs.collect_update

        def counted(*args):
            self.fused += 1
            return one(*args)

        run.programs = replace(run.programs, collect_update=None if self.split else counted)
        return run


class Split(Rounds):
    split = True


def test_a_dpo_round_is_one_program_with_the_bits_of_collect_then_update(tmp_path):
    """DPO's round (the reference's log-probs, then one step) runs as `collect_update`: the same
    rows and params, bit for bit, as the two programs one after the other (2 micro-batches)."""
    cfg = make_cfg(DPO + QUICK + ["trainer.steps=3", "trainer.log_every=1", "trainer.eval_every=0",
                                  "data.batch_size=4", "trainer.grad_accum=2"])
    results = []
    for kind in (Rounds, Split):
        (tmp_path / kind.__name__).mkdir()
        exp, cap = captured(build(cfg, str(tmp_path / kind.__name__)))
        trainer = kind(exp)
        trainer.run()
        rows = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in cap.rows]
        results.append((trainer.fused, rows, jax.tree.map(np.asarray, trainer.state.params)))
    (fused, one, one_params), (none, two, two_params) = results
    assert (fused, none) == (3, 0)
    assert [r["step"] for r in one if "train/loss" in r] == [1, 2, 3] and one == two
    jax.tree.map(np.testing.assert_array_equal, one_params, two_params)


def test_only_a_round_with_nothing_between_collect_and_its_one_step_is_one_program():
    """DPO: yes; SFT (no collect), a host score or finalize (GRPO, PPO), several steps: no."""
    assert one_program(DPOAlgorithm()) and not one_program(SFTAlgorithm())
    dpo = dict(collect=len, score=None, finalize=None, schedule=Schedule())
    for change in (dict(score=len), dict(finalize=len), dict(schedule=Schedule(epochs=2)),
                   dict(schedule=Schedule(minibatches=2))):
        assert not one_program(SimpleNamespace(**{**dpo, **change})), change


def test_uneven_micro_batches_make_the_mean_of_means_wrong(tmp_path):
    """The data of the test above is uneven: averaging per-micro-batch means (optax.MultiSteps)
    would differ from the token mean, so that test can tell the two apart."""
    exp = build(make_cfg(SFT + QUICK + [f"run_dir={tmp_path}"]), str(tmp_path))
    batch = next(iter(exp.train_batches))
    parts = [jax.tree.map(lambda x, i=i: x[i:i + 2], batch) for i in range(0, 8, 2)]
    loss = nnx.jit(lambda model, b: loss_of(exp.algorithm, model, b)[0])  # compiled once per batch shape
    whole = loss(exp.model, batch)
    means = [float(loss(exp.model, p)) for p in parts]
    assert len({float(p["loss_mask"].sum()) for p in parts}) > 1  # uneven token counts
    assert abs(np.mean(means) - float(whole)) > 1e-3


def test_loop_syncs_only_at_logging_steps(tmp_path, monkeypatch):
    """No implicit device->host transfer anywhere; explicit ones only when logging or evaluating."""
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=12", "trainer.log_every=4", "trainer.eval_every=6"])
    exp = build(cfg, str(tmp_path))
    calls = []
    real = metrics_hook.means  # the train window's means and, through window_mean, the eval batches'
    monkeypatch.setattr(metrics_hook, "means",
                        lambda rows, prefix, **kw: calls.append(prefix) or real(rows, prefix, **kw))
    with jax.transfer_guard_device_to_host("disallow"):
        train(exp)
    # train: steps 4, 8, 12; eval: steps 0, 6, 12
    assert calls.count("train/") == 3 and calls.count("eval/") == 3


def test_each_program_compiles_once_with_grad_accum(tmp_path, caplog):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=6", "trainer.grad_accum=2",
                           "trainer.log_every=2", "trainer.eval_every=3"])
    # from the build on: the round's program compiles there (stack.engine.precompile)
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING):
            train(build(cfg, str(tmp_path)))
    finally:
        jax.config.update("jax_log_compiles", False)
    compiles = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    # SFT has no collect / finalize: the batch is the experience, no program runs for them
    for name, times in (("update", 1), ("evaluate", 1), ("finalize", 0), ("collect", 0)):
        assert sum(f"Compiling jit({name})" in m for m in compiles) == times, (name, compiles)


def test_lr_logged_follows_schedule(tmp_path):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=10", "trainer.log_every=5",
                           "optimizer.warmup_steps=4"])
    exp, cap = captured(build(cfg, str(tmp_path)))
    train(exp)
    rows = [r for r in cap.rows if "train/lr" in r]
    assert [r["step"] for r in rows] == [5, 10]
    # the update's own lr at the logged step (index step-1), not the window's mean: warmup to the
    # peak over 4 steps, then cosine decay to 0.1 x peak over steps 4..10 (optax warmup_cosine_decay_schedule)
    peak, end = cfg.optimizer.lr, cfg.optimizer.extra.end_lr_ratio * cfg.optimizer.lr
    cosine = lambda i: end + (peak - end) * 0.5 * (1 + np.cos(np.pi * (i - 4) / 6))  # noqa: E731
    assert rows[0]["train/lr"] == pytest.approx(cosine(4), rel=1e-6) == pytest.approx(peak, rel=1e-6)
    assert rows[1]["train/lr"] == pytest.approx(cosine(9), rel=1e-6)


class FetchedAt(Hook):
    """At each completion of held rows: (their steps, the step waited for, the optimizer steps
    dispatched by then)."""

    def __init__(self) -> None:
        self.seen: list[tuple[list[int], int, int]] = []

    def take(self, run) -> int:
        return run.step

    def log(self, run, rows) -> None:
        self.seen.append(([step for _, step in rows], run.synced, int(jax.device_get(run.state.step))))


def test_logging_rows_are_completed_at_waits_that_leave_a_step_queued(tmp_path):
    """Between evals, each wait is for the step before the newest dispatched (the device never idles
    for the log) and completes every row held up to it; the last rows at the end."""
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=6", "trainer.log_every=1", "trainer.eval_every=0"])
    trainer, hook = Trainer(build(cfg, str(tmp_path))), FetchedAt()
    trainer.hooks.append(hook)
    trainer.run()
    assert [step for steps, _, _ in hook.seen for step in steps] == [1, 2, 3, 4, 5, 6]
    *during, end = hook.seen
    assert during and all(max(steps) <= synced == dispatched - 1 for steps, synced, dispatched in during)
    assert end[1:] == (6, 6)


class SavesAt(Hook):
    """Asks for a wait at the round end of `step`, as a checkpoint save does, and records the
    steps of the rows the sinks had by its `after_round`."""

    def __init__(self, step: int, cap) -> None:
        self.step, self.cap, self.seen = step, cap, None

    def waits(self, run) -> bool:
        return run.step == self.step

    def after_round(self, run) -> None:
        if run.step == self.step:
            self.seen = [r["step"] for r in self.cap.rows]


def test_a_saved_steps_rows_reach_the_sinks_before_the_save(tmp_path):
    """Rows held on the rhythm (steps 3-4 here: a tiny step waits every ~20) are emitted before a
    round end that saves, so a run killed after its checkpoint never resumes without them."""
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=6", "trainer.log_every=1", "trainer.eval_every=0"])
    exp, cap = captured(build(cfg, str(tmp_path)))
    trainer, hook = Trainer(exp), SavesAt(4, cap)
    trainer.hooks.append(hook)
    trainer.run()
    assert hook.seen == [0, 1, 2, 3, 4]


class TermAt(Hook):
    """Sends this process SIGTERM during step `step`; `seen`: the steps of the rows the sinks had
    when the round end that stops the run (and saves) came to this hook, after Signals'."""

    def __init__(self, step: int, cap) -> None:
        self.step, self.cap, self.seen = step, cap, None

    def after_step(self, run, metrics, row) -> None:
        if run.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def after_round(self, run) -> None:
        if run.status == PREEMPTED and self.seen is None:
            self.seen = [r["step"] for r in self.cap.rows]


def test_a_preempted_round_end_emits_its_held_rows_before_it_saves(tmp_path):
    """Steps 1-3 are held on the rhythm when SIGTERM arrives: they reach the sinks before the
    round end that stops the run saves (its save blocks, and the grace period may end in it)."""
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=8", "trainer.log_every=1", "trainer.eval_every=0"])
    exp, cap = captured(build(cfg, str(tmp_path)))
    trainer, hook = Trainer(exp), TermAt(3, cap)
    trainer.hooks.append(hook)
    summary = trainer.run()
    assert summary.status == PREEMPTED and summary.final_step == 3
    assert hook.seen == [0, 1, 2, 3]


def test_rows_reach_the_sinks_in_step_order_with_eval_rows_between(tmp_path):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=6", "trainer.log_every=2", "trainer.eval_every=3"])
    exp, cap = captured(build(cfg, str(tmp_path)))
    Trainer(exp).run()
    assert [(r["step"], "train/loss" in r, "eval/loss" in r) for r in cap.rows] == [
        (0, False, True), (2, True, False), (3, False, True), (4, True, False), (6, True, True)]


class CallOrder(Trainer):
    """A Trainer whose run records the order of its train steps (`update`, or `collect_update`
    where a round is one program) and `evaluate` calls in `calls`."""

    def start(self):
        run = super().start()
        self.calls: list[str] = []
        rec = lambda name, f: lambda *a: self.calls.append(name) or f(*a)  # noqa: E731
        p = run.programs
        step = {"update": rec("update", p.update)} if p.collect_update is None else \
            {"collect_update": rec("update", p.collect_update)}
        run.programs = replace(p, **step, evaluate=rec("evaluate", p.evaluate))
        return run


def test_the_starting_eval_follows_the_first_step_yet_evaluates_the_starting_model(tmp_path):
    """Not in front of the first step (its compilation would be); its step-0 row equals an eval
    of an identically built run's initial state taken before any step (the reference: DPO's
    margins are 0 there, the reference model being the starting policy)."""
    cfg = make_cfg(DPO + TINY + [f"run_dir={tmp_path}", "trainer.steps=2", "trainer.eval_every=0",
                                 "optimizer.warmup_steps=0"])  # the first step changes the policy
    exp, cap = captured(build(cfg, str(tmp_path)))
    trainer = CallOrder(exp)
    trainer.run()
    assert trainer.calls[:2] == ["update", "evaluate"] and trainer.calls.count("evaluate") == 2
    with jax.set_mesh(exp.mesh), nnx.logical_axis_rules(exp.rules):
        run = Trainer(build(cfg, str(tmp_path))).start()
        before = evaluate(run, run.state.models_only())
    assert cap.rows[0] == {"step": 0, **before} and before["eval/rewards/margins"] == 0.0


class FailAt(Hook):
    """Raises at the round end of `step` (after the trainer held that step's row)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_round(self, run) -> None:
        if run.step == self.step:
            raise RuntimeError("boom")


def test_a_crash_still_logs_the_held_row(tmp_path):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=6", "trainer.log_every=2"])
    exp, cap = captured(build(cfg, str(tmp_path)))
    trainer = Trainer(exp)
    trainer.hooks.append(FailAt(4))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.run()
    assert [r["step"] for r in cap.rows if "train/loss" in r] == [2, 4]


def test_nan_loss_stops_the_run_with_a_status(tmp_path):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=4", "trainer.log_every=1",
                           "optimizer.lr=nan", "optimizer.warmup_steps=0"])
    summary = train(build(cfg, str(tmp_path)))
    # step 2's loss is the first non-finite one (step 1's params were finite); its row is completed
    # at a wait after step 3 is dispatched, so the run stops after step 3's round or a later one
    assert summary.status == "stopped_nonfinite" and 3 <= summary.final_step <= 4
    assert "at step 2" in summary.message and "nan_policy" in summary.message


def test_summary_is_typed_and_names_the_objective(tmp_path):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=4", "trainer.log_every=2", "trainer.eval_every=2"])
    summary = train(build(cfg, str(tmp_path)))
    rows = read_metrics(tmp_path)
    assert summary.status == "completed" and (summary.first_step, summary.final_step) == (1, 4)
    assert summary.metric("eval/loss") == rows[-1]["eval/loss"] and summary.metric("nope") is None
    assert [s for s, _ in summary.eval_history] == [0, 2, 4]
    assert summary.best("eval/loss") == min(m["eval/loss"] for _, m in summary.eval_history)
    assert summary.eval_at_start["eval/loss"] == rows[0]["eval/loss"] and rows[0]["step"] == 0
    assert summary.perf["perf/tokens_per_sec"] > 0 and summary.run_dir == str(tmp_path)


def test_a_one_step_run_reports_no_rate_rather_than_zero(tmp_path):
    """Its only step compiled, so nothing measures a steady rate: summary.json had perf/tokens_per_sec
    0 and perf/mfu 0, and the last line said '0 tok/s, MFU 0.0%'."""
    from stack.run.modes import describe

    summary = train(build(make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=1"]), str(tmp_path)))
    assert summary.final_step == 1 and summary.perf["compile_seconds"] > 0
    assert not {"perf/tokens_per_sec", "perf/mfu"} & set(summary.perf)
    assert "| no tok/s (its one step compiled) |" in describe(summary, "eval/loss")


def test_global_batch_in_one_process_is_the_stacked_rows(tmp_path):
    exp = build(make_cfg(TINY + [f"run_dir={tmp_path}", "data=jsonl_prompts"]), str(tmp_path))
    rows = [exp.eval_batches[0], exp.eval_batches[0]]
    device, host = global_batch(rows, batch_sharding(exp.mesh, exp.rules))
    assert set(device) == {"prompt_ids", "prompt_mask", "index"} and set(host) == {"answer", "fields"}
    np.testing.assert_array_equal(np.asarray(device["prompt_ids"]), np.stack([r["prompt_ids"] for r in rows]))
    assert host["answer"].shape == (2, 8)


def test_an_old_format_checkpoint_is_refused_with_the_reason(tmp_path):
    """A checkpoint of the earlier layout (params + optax.MultiSteps state, no format) is not misread."""
    import optax

    overrides = TINY + [f"run_dir={tmp_path}", "trainer.steps=2"]
    exp = build(make_cfg(overrides), str(tmp_path))
    params = nnx.state(exp.model, nnx.Param)
    old = {"params": params, "opt_state": optax.MultiSteps(exp.tx, 4).init(params)}
    with ocp.CheckpointManager(str(tmp_path / "checkpoints")) as manager:
        manager.save(5, args=ocp.args.Composite(state=ocp.args.StandardSave(old), data=ocp.args.JsonSave({}),
                                                meta=ocp.args.JsonSave({"step": 5, "config": {}})))
    with pytest.raises(ConfigError, match=r"format 1 .*MultiSteps.*format 2"):
        train(build(make_cfg(overrides + ["checkpoint=local"]), str(tmp_path)))
    other = build(make_cfg(overrides + ["seed=7"]), str(tmp_path)).model  # model.init_from reads its params
    assert load_params(other, str(tmp_path / "checkpoints")) == 5
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(nnx.state(other, nnx.Param)),
                 nnx.to_pure_dict(params))


def test_resume_from_another_run_takes_its_run_dir_and_refuses_a_dir_without_steps(tmp_path):
    """checkpoint.resume=PATH given a run dir (not its checkpoints/) trained from scratch, silently."""
    from stack.run.modes import run

    run(make_cfg(TINY + [f"run_dir={tmp_path}/a", "trainer.steps=2", "checkpoint=local"]))
    b = make_cfg(TINY + [f"run_dir={tmp_path}/b", "trainer.steps=3", "checkpoint=local",
                         f"checkpoint.resume={tmp_path}/a"])
    summary = train(build(b, f"{tmp_path}/b"))
    assert (summary.first_step, summary.final_step) == (3, 3)  # resumed after a's step 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="'checkpoint.resume'=.*empty' holds no complete checkpoint step"):
        build(make_cfg(TINY + [f"run_dir={tmp_path}/c", "checkpoint=local", f"checkpoint.resume={tmp_path}/empty"]),
              f"{tmp_path}/c")


def test_an_on_policy_algorithm_runs_through_the_same_trainer(tmp_path):
    """REINFORCE toy (tests/unit/toy_reinforce.py): collect samples, the host scores, finalize
    attaches rewards, 2 epochs x 2 minibatches per round, an extra trained module, algorithm
    state; the reward rises."""
    cfg = make_cfg(["data=jsonl_prompts", "data.batch_size=16", "trainer.steps=40", "trainer.log_every=4",
                    "trainer.eval_every=20", "trainer.eval_batches=2", "optimizer.lr=1e-2", "optimizer.warmup_steps=0",
                    "logger=jsonl", f"run_dir={tmp_path}"])
    exp, cap = captured(replace(build(cfg, str(tmp_path)), algorithm=Reinforce()))
    trainer = Trainer(exp)
    summary = trainer.run()
    rewards = [r["train/reward"] for r in cap.rows if "train/reward" in r]
    assert summary.final_step == 40 and len(rewards) == 10
    assert rewards[0] < 0.5 and np.mean(rewards[-2:]) > 0.8, rewards
    assert float(trainer.state.algo["rounds"]) == 10  # 4 optimizer steps per round
    assert summary.eval["eval/reward"] > summary.eval_at_start["eval/reward"]
    baseline = float(trainer.state.params["baseline"]["value"])
    assert baseline > 0.1  # the extra module trained too (from 0, towards the mean reward)


class SlowScore(Reinforce):
    """A round of `epochs` optimizer steps whose host scoring takes `seconds` (as a reward function would)."""

    def __init__(self, epochs: int, seconds: float) -> None:
        self.schedule, self.seconds = Schedule(epochs=epochs, minibatches=1), seconds

    def score(self, xp, host):
        time.sleep(self.seconds)
        return Reinforce.score(xp, host)


class DeviceScored(Reinforce):
    """Rounds of 4 optimizer steps whose rewards are computed on the device (no host `score`)."""

    score = scores_spec = None
    schedule = Schedule(epochs=4, minibatches=1)

    @staticmethod
    def rewards(xp):
        return (xp["action"] == TARGET).astype(jnp.float32)

    def finalize(self, xp, scores, state):
        return Reinforce.finalize(self, xp, self.rewards(xp), state)

    def evaluate(self, models, xp, scores, frozen, state):
        return {"reward": self.rewards(xp).mean()}


class SleepsAfterSteps(Hook):
    """75 ms of host work after each step: the loop's rhythm then waits every 2 steps."""

    def after_step(self, run, metrics, row) -> None:
        time.sleep(0.075)


def toy_trainer(tmp_path, algorithm, *overrides: str):
    """(Trainer, captured sink) of a tiny model running `algorithm` on the prompt data, logging every step."""
    cfg = make_cfg(["data=jsonl_prompts", "data.batch_size=4", "trainer.log_every=1", "trainer.eval_every=0",
                    "trainer.eval_batches=1", "logger=jsonl", f"run_dir={tmp_path}", *TINY[:5], *overrides])
    exp, cap = captured(replace(build(cfg, str(tmp_path)), algorithm=algorithm))
    return Trainer(exp), cap


@pytest.mark.parametrize("algorithm, hooks, seconds", [(SlowScore(1, 0.05), [], 0.05), (SlowScore(4, 0.3), [], 0.3),
                                                       (DeviceScored(), [SleepsAfterSteps()], 0.3)],
                         ids=["host-scored-1-step", "host-scored-4-steps", "device-scored-4-steps"])
def test_on_policy_rows_are_timed_per_round(tmp_path, algorithm, hooks, seconds):
    """The rows of a round close together, on its boundary, and share its time: each holds its
    share of the round's host work (`seconds` a round). Closed at the loop's usual waits, a 1-step
    round's row held the next round's scoring and the last row read ~0.4 ms; 4-step rounds of 75 ms
    a step (the loop waits every 2 steps) split a round over two rows' windows (PPO's rows 2-3 read
    0.108 s, row 4 0.0007 s: MFU 35x)."""
    trainer, cap = toy_trainer(tmp_path, algorithm, "trainer.steps=12")
    trainer.hooks += hooks
    trainer.run()
    per_step = {r["step"]: r["perf/step_seconds"] for r in cap.rows if "perf/step_seconds" in r}
    assert list(per_step) == list(range(2, 13)), per_step  # step 1 compiled: no rates
    n = algorithm.schedule.epochs
    rounds = [[per_step[s] for s in range(first, first + n)] for first in range(1 + n, 13, n)]
    assert all(len(set(r)) == 1 for r in rounds), rounds  # the first round's host work came before its step 1
    assert min(r[0] for r in rounds) >= seconds / n, rounds


def test_a_nan_found_at_a_round_start_stops_before_that_round(tmp_path):
    """Host-scored 1-step rounds: step 2's loss is the first non-finite one; its row is completed at
    round 3's start, which then runs nothing (it ran on the NaN params before: final step 3)."""
    trainer, _ = toy_trainer(tmp_path, SlowScore(1, 0.0), "trainer.steps=6", "optimizer.lr=nan",
                             "optimizer.warmup_steps=0")
    summary = trainer.run()
    assert summary.status == "stopped_nonfinite" and "at step 2" in summary.message
    assert summary.final_step == 2


def test_config_error_when_steps_do_not_fill_rounds(tmp_path):
    cfg = make_cfg(["data=jsonl_prompts", "trainer.steps=6", f"run_dir={tmp_path}"] + QUICK)
    with pytest.raises(ConfigError, match=r"'trainer.steps'=6 is not a multiple of the 4"):
        Trainer(replace(build(cfg, str(tmp_path)), algorithm=Reinforce()))


def test_loss_terms_divide_once_over_the_whole_batch():
    num, den = np.array([6.0, 2.0]), np.array([3.0, 4.0])
    assert float(ratio((num, den))) == pytest.approx(6 / 3 + 2 / 4)
    assert float(ratio((np.float32(0.0), np.float32(0.0)))) == 0.0  # a term with no items: 0, not NaN


def test_metrics_jsonl_has_one_row_per_step(tmp_path):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=4", "trainer.log_every=2", "trainer.eval_every=3"])
    summary = train(build(cfg, str(tmp_path)))
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == [0, 2, 3, 4] and summary.final_step == 4


def test_minibatches_partition_the_round_and_shuffle_anew_each_epoch():
    """2 epochs x 2 minibatches of a round of 4 micro-batches x 3 rows, grad_accum 2: without
    shuffle minibatch i is micro-batches [2i, 2i+2); with it each epoch's two minibatches hold
    every row once, in an order drawn per epoch and per round (TRL PPOTrainer), the same on a rerun."""
    xp = {"x": np.arange(12).reshape(4, 3), "y": -np.arange(12).reshape(4, 3)}
    key = jax.random.key_data(jax.random.key(0))

    def rows(schedule, start, j):
        mb = minibatch(xp, j, 2, schedule, SimpleNamespace(key=key, step=start + j))
        np.testing.assert_array_equal(mb["y"], -mb["x"])  # columns move together
        return np.asarray(mb["x"]).ravel()

    plain = Schedule(2, 2)
    np.testing.assert_array_equal(rows(plain, 0, 3), np.arange(6, 12))
    shuffled = Schedule(2, 2, shuffle=True)
    epochs = [np.concatenate([rows(shuffled, 8, j), rows(shuffled, 8, j + 1)]) for j in (0, 2)]
    for order in epochs:
        assert sorted(order) == list(range(12))
    assert list(epochs[0]) != list(epochs[1]) and list(epochs[0]) != list(range(12))
    np.testing.assert_array_equal(rows(shuffled, 8, 0), epochs[0][:6])  # a resumed run draws the same
    assert list(rows(shuffled, 12, 0)) != list(epochs[0][:6])  # the next round draws anew

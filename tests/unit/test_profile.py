"""`trainer.profile=[START,STOP]`: a jax.profiler trace of exactly those steps in the run dir,
read back with jax's own ProfileData; the losses are those of an untraced run."""

import glob

import pytest
from jax.profiler import ProfileData

from stack.config.validate import validate
from stack.engine.trainer import Trainer
from stack.errors import ConfigError
from stack.run.build import build
from tests.helpers import captured, make_cfg

RUN = ["+recipe=llama_sft", "checkpoint=none", "model.d_model=32", "model.n_heads=2", "model.n_kv_heads=1",
       "model.d_ff=64", "model.n_layers=1", "data.batch_size=4", "trainer.eval_batches=1", "trainer.steps=4",
       "trainer.log_every=1", "trainer.eval_every=0"]


def traced(tmp_path, profile: str | None) -> tuple[list[float], int]:
    """(per-step losses, how many times the jitted training step ran inside the trace)."""
    tmp_path.mkdir()
    overrides = RUN + [f"run_dir={tmp_path}"] + ([f"trainer.profile={profile}"] if profile else [])
    exp, cap = captured(build(make_cfg(overrides), str(tmp_path)))
    Trainer(exp).run()
    losses = [r["train/loss"] for r in cap.rows if "train/loss" in r]
    traces = glob.glob(str(tmp_path / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    if not profile:
        assert traces == []
        return losses, 0
    (trace,) = traces
    events = [e.name for p in ProfileData.from_file(trace).planes for line in p.lines for e in line.events]
    return losses, events.count("PjitFunction(update)")


def test_the_trace_holds_the_given_steps_and_changes_no_loss(tmp_path):
    plain, _ = traced(tmp_path / "plain", None)
    one_losses, one = traced(tmp_path / "one", "[3,3]")
    two_losses, two = traced(tmp_path / "two", "[2,3]")
    assert one > 0 and two == 2 * one  # steps 2..3 hold twice the step launches of step 3 alone
    assert one_losses == two_losses == plain


@pytest.mark.parametrize("bad", ["[0,2]", "[3,2]", "[1,5]", "[2]", "[1,2,3]"])
def test_a_bad_profile_range_is_refused(bad):
    with pytest.raises(ConfigError, match=r"'trainer.profile'=.*1 <= START <= STOP <= trainer.steps \(4\)"):
        validate(make_cfg(RUN + [f"trainer.profile={bad}"]))

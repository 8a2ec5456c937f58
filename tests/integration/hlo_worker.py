"""Run by test_meshes.py with 8 fake CPU devices: the train step that `mode=compile` lowers
(abstract inputs) and the one training lowers (the real state and round) as StableHLO text."""

import itertools
import json
import sys
import tempfile

import jax
from flax import nnx

from stack.engine.aot import abstract_run, lower_update
from stack.engine.trainer import Trainer
from stack.run.build import build
from tests.helpers import QUICK, make_cfg


def main(overrides: list[str]) -> None:
    cfg = make_cfg(QUICK + ["trainer.steps=2"] + overrides)
    compiled = build(cfg, "", abstract=True)
    text_compile = lower_update(compiled, abstract_run(compiled)).as_text()
    exp = build(cfg, tempfile.mkdtemp())
    trainer = Trainer(exp)
    with jax.set_mesh(exp.mesh), nnx.logical_axis_rules(exp.rules):
        run = trainer.start()
        batch, _, _ = trainer.feed.read()
        xp = run.programs.collect(run.state.models_only(), run.frozen, batch, True)
        text_train = run.programs.update.lower(run.state, run.frozen, xp, 0).as_text()
    trainer.feed.close()
    lines = list(itertools.zip_longest(text_compile.splitlines(), text_train.splitlines()))  # an extra line differs too
    diff = [pair for pair in lines if pair[0] != pair[1]][:3]
    print(json.dumps({"devices": jax.device_count(), "equal": text_compile == text_train, "diff": diff,
                      "lines": len(lines)}))


if __name__ == "__main__":
    main(sys.argv[1:])

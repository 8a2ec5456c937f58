"""Every tool that reads a run (generate, hf export, quantize) answers bad input as training does:
one paragraph naming the path and what to do, exit 2, no traceback, for a missing path, an empty
dir, a damaged checkpoint and a config.yaml that is not one (a python tag: never constructed)."""

import re
import shutil

import pytest

from stack.tools import generate, hf, quantize
from tests.helpers import run_cli

TOOLS = {
    "generate": lambda path, out: generate.main([path, "--prompt", "1+1=", "--max-new-tokens", "2"]),
    "hf export": lambda path, out: hf.main(["export", path, "--out", out]),
    "quantize": lambda path, out: quantize.main([path, "quantization=w8_ptq", "--out", out]),
}
CASES = {
    "missing": ("no such|neither a Hugging Face|no run config.yaml", lambda run, bad: bad / "missing"),
    "empty": ("neither a Hugging Face|no complete checkpoint step|no run config.yaml", lambda run, bad: bad),
    "damaged": ("Checkpoint step 2 of .* cannot be read, its files are damaged or incomplete", lambda run, bad: run),
    "config": ("config.yaml' cannot be read as a run's config \\(ConstructorError", lambda run, bad: run),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("entry")
    res = run_cli(["trainer.steps=2", "trainer.eval_batches=1", "checkpoint=local", f"run_dir={root / 'run'}"],
                  cwd=str(root))
    assert res.returncode == 0, res.stderr[-2000:]
    damaged, config = root / "damaged", root / "config"
    shutil.copytree(root / "run", damaged)
    for f in (damaged / "checkpoints" / "2" / "state").rglob("d/*"):
        f.write_bytes(b"\0" * 100)
    shutil.copytree(root / "run", config)
    (config / "config.yaml").write_text('model: !!python/object/apply:os.system ["touch ran"]\n')
    (root / "empty").mkdir()
    return root


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("tool", TOOLS)
def test_bad_input_is_one_paragraph_and_exit_2(runs, tool, case, capsys, tmp_path):
    words, where = CASES[case]
    path = where(runs / ("damaged" if case == "damaged" else "config"), runs / "empty")
    with pytest.raises(SystemExit) as info:
        TOOLS[tool](str(path), str(tmp_path / "out"))
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith("error: ") and "\n" not in err, err[-3000:]
    assert re.search(words, err), err
    assert not (tmp_path / "out").exists() and not (tmp_path / "ran").exists()

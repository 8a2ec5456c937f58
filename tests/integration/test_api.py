"""The Python API as a user calls it (issue 81 item 2): docs/python_api.md's example runs as written;
`import stack` imports no jax; bad input raises the command line's paragraph."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stack
from stack.errors import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "python_api.md"


@pytest.mark.slow  # ~10 s: a kernel, a 60-step run, generation and an export (CI's slow tier runs it)
def test_the_documented_example_runs_in_a_notebook_and_learns(tmp_path):
    """docs/python_api.md's example as one notebook cell, run by a real Jupyter kernel (nbclient +
    ipykernel): the progress bar is tqdm's notebook widget, not text."""
    import nbformat
    from nbclient import NotebookClient

    (code,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    where = {"metadata": {"path": str(tmp_path)}}  # the kernel's working directory
    NotebookClient(notebook, timeout=240, kernel_name="python3", resources=where).execute()
    outputs = notebook.cells[0].outputs
    widgets = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widgets and "/60 [" in widgets[0]["data"]["text/plain"], outputs  # tqdm.notebook's bar, as first drawn
    models = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"].values()
    bars = [m["state"] for m in models if m["model_name"] == "FloatProgressModel"]
    texts = [str(m["state"]["value"]).replace("\u2007", " ") for m in models if m["model_name"] == "HTMLModel"]
    assert [(b["value"], b["max"]) for b in bars] == [(60, 60)] and any("60/60 [" in t and "tok/s" in t for t in texts)
    text = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream" and o["name"] == "stdout")
    lines = [line for line in text.splitlines() if not line.startswith(("step ", " ", "resumed", "done"))]
    status, step, loss = lines[0].split()
    assert (status, step) == ("completed", "60") and float(loss) < 3.0, text  # from ~5.9 at step 0
    completions = ast.literal_eval(lines[1])
    assert len(completions) == 2 and all(len(c) == 1 and isinstance(c[0], str) for c in completions)
    assert lines[2] == "exported step 60" and (tmp_path / "runs" / "api" / "hf" / "config.json").is_file()
    assert (tmp_path / "runs" / "api" / "config.yaml").read_text().count("lr: 0.003") == 1  # the change trained


def test_importing_stack_imports_no_jax():
    code = "import sys, stack; stack.API; print(sorted(m for m in ('jax', 'hydra', 'omegaconf') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_bad_input_raises_the_command_lines_paragraph(tmp_path):
    with pytest.raises(ConfigError, match=r"^Wrong type for 'optimizer.lr': got 'fast', expected a value of type"):
        stack.compose(["optimizer.lr=fast"])
    with pytest.raises(ConfigError, match="no recipe|'llama_sfx'"):
        stack.load_recipe("llama_sfx")
    with pytest.raises(ConfigError, match=r"^temperature=-1: temperature must be >= 0"):
        stack.generate(str(tmp_path), ["1+1="], temperature=-1)
    with pytest.raises(ConfigError, match="stack.train needs a run dir"):
        stack.train(stack.compose(["trainer.steps=2"]))
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        stack.trian  # noqa: B018

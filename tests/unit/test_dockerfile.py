"""launchers/Dockerfile, the image `launcher=xpk` documents, read as Docker reads it (no Docker
daemon here or in CI, so no image is built): known instructions, every COPY source in the
repository, the package and its TPU extra installed from what was copied, a WORKDIR away from the
source (where `python -m stack` would import the source tree's `stack/` without `stack.conf`)."""

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KNOWN = {"FROM", "ENV", "COPY", "RUN", "WORKDIR", "CMD", "ENTRYPOINT", "ARG", "LABEL", "USER", "EXPOSE"}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: comments dropped, `\\` continuations joined."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def test_the_xpk_image_installs_the_copied_package_and_runs_away_from_its_source():
    steps = instructions((ROOT / "launchers" / "Dockerfile").read_text())
    assert steps[0][0] == "FROM" and {word for word, _ in steps} <= KNOWN
    copied = [shlex.split(args) for word, args in steps if word == "COPY"]
    for *sources, dest in copied:
        assert all((ROOT / s).exists() for s in sources), sources  # relative to the build context: the root
    dests = {dest.rstrip("/") for *_, dest in copied}
    assert {"/src", "/src/stack", "/src/conf", "/src/recipes"} <= dests
    assert "pyproject.toml" in copied[0] and "README.md" in copied[0]  # pyproject reads the README
    (install,) = [args for word, args in steps if word == "RUN" and "pip install" in args]
    assert '"/src[tpu]"' in install  # libtpu: the image runs on TPU hosts
    workdir = [args for word, args in steps if word == "WORKDIR"][-1]
    assert not workdir.startswith("/src")
    assert "docker build -f launchers/Dockerfile" in (ROOT / "launchers" / "README.md").read_text()

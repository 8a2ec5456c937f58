"""Every package stack's own code imports is a declared dependency of pyproject.toml (issue 81:
PyYAML, absl and submitit came only through other packages), not an accident of what else is
installed."""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_packages() -> set[str]:
    """Top-level names of the modules stack/ imports, standard library and stack excluded."""
    names = set()
    for path in (ROOT / "stack").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"stack", "hydra_plugins"}


def declared() -> set[str]:
    """Distribution names of the base dependencies, normalised (PEP 503)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~;\[ ]", d, 1)[0].lower().replace("_", "-") for d in project["dependencies"]}


def test_every_imported_package_is_declared():
    dists = importlib.metadata.packages_distributions()
    missing = {name: dists.get(name) for name in imported_packages()
               if not {d.lower().replace("_", "-") for d in dists.get(name, [name])} & declared()}
    assert missing == {}, f"imported by stack/ but not in pyproject.toml's dependencies: {missing}"

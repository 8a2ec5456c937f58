"""Design rules of DESIGN.md, enforced on the source: small functions and files, one place
that instantiates config, and a trainer that never names an algorithm."""

import ast
import pathlib
import re

import pytest

STACK = pathlib.Path(__file__).resolve().parents[2] / "stack"
SOURCES = sorted(STACK.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(STACK)))
def test_files_and_functions_stay_small(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 300, "a file past 300 lines wants splitting"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno - node.lineno < 50, f"{node.name} is {node.end_lineno - node.lineno + 1} lines"


def test_only_build_and_the_optimizer_chain_instantiate_config():
    """run/build.py makes every object of the config; optim/chain.py, which build calls after every
    `_target_` was judged, makes the optimizer's list of transforms."""
    users = sorted(str(p.relative_to(STACK)) for p in SOURCES if re.search(r"\binstantiate\(", p.read_text()))
    assert users == ["optim/chain.py", "run/build.py"]


def test_the_trainer_and_the_step_never_name_an_algorithm():
    """("sft" is also a record kind, so only the names that are algorithms alone are searched.)"""
    for path in [*STACK.joinpath("engine").rglob("*.py"), STACK / "config" / "validate.py"]:
        code = path.read_text()
        assert "algorithm.name" not in code.replace("cfg.algorithm.name!r", ""), path.name
        for name in ("dpo", "grpo", "ppo", "rm"):
            assert not re.search(rf"""["']{name}["']""", code), f"{path.name} names {name!r}"


def test_no_module_imports_another_modules_private_names():
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stack"):
                assert not [a.name for a in node.names if a.name.startswith("_")], path.name


def test_every_package_ships_in_the_wheel():
    """pyproject lists packages by hand (conf/ and recipes/ are mapped into stack.conf): a new
    subpackage missing there imports from a checkout and fails from an installed wheel."""
    import tomllib

    listed = set(tomllib.loads((STACK.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(STACK.parent).parts) for p in STACK.rglob("__init__.py")}
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages"


def test_python_3_11_gets_an_ml_dtypes_that_imports_fast():
    """pyproject keeps Python 3.11 (numpy 2.4) on ml_dtypes < 0.7: that pair takes ~1 s to import, in
    every process that imports jax (see the pin's comment); 0.6.0 takes 0.01 s. Python >= 3.12
    resolves numpy >= 2.5, with which ml_dtypes 0.7 imports fast."""
    import sys
    from importlib.metadata import version

    ml_dtypes = tuple(map(int, version("ml_dtypes").split(".")[:2]))
    assert sys.version_info >= (3, 12) or ml_dtypes < (0, 7), f"ml_dtypes {ml_dtypes}: reinstall (pip install -e .)"


def test_every_zip_says_whether_its_lengths_must_match():
    """A plain zip() stops at the shortest input: a row, weight or result gone missing is dropped
    silently. Each call in the code, the bench and the tests passes strict= (True: equal lengths)."""
    root = STACK.parent
    bare = [f"{path.relative_to(root)}:{node.lineno}"
            for path in sorted([*root.joinpath("stack").rglob("*.py"), *root.joinpath("bench").rglob("*.py"),
                                *root.joinpath("tests").rglob("*.py")])
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "zip"
            and not any(k.arg == "strict" for k in node.keywords)]
    assert not bare, f"zip() without strict= at {bare}"


# The floors of the house, lowest first (README "Layout"): a package imports only packages on floors
# below its own; packages on one floor do not import each other.
FLOORS = (("errors",), ("config",), ("hardware",), ("models", "data", "optim", "logging"), ("quant", "rollout"),
          ("checkpoint",), ("rewards",), ("algorithms",), ("engine",), ("launch",), ("run",), ("tools",), ("cli",),
          ("__main__",))
FLOOR = {package: i for i, floor in enumerate(FLOORS) for package in floor}


def package_of(module: str) -> str:
    """`stack.engine.trainer.hooks` -> `engine`; `stack.errors` -> `errors`."""
    return module.split(".")[1]


def stack_imports(path: pathlib.Path) -> list[tuple[int, str, bool]]:
    """(line, imported stack module, inside a function) of each import in `path`, leaving out
    `if TYPE_CHECKING:` blocks (annotations only: nothing is imported when the code runs)."""
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", "") == "TYPE_CHECKING":
                continue
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and (child.module or "").split(".")[0] == "stack":
                names = [f"{child.module}.{a.name}" for a in child.names]  # `from stack.x import y`: y may be a module
                found.append((child.lineno, child.module if child.module != "stack" else names[0], in_function))
            elif isinstance(child, ast.Import):
                found.extend((child.lineno, a.name, in_function) for a in child.names
                             if a.name.split(".")[0] == "stack")
            walk(child, inside)

    walk(ast.parse(path.read_text()), False)
    return found


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(STACK.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(STACK)))
def test_a_package_imports_only_the_floors_below_it(path):
    module = module_name(path)
    if module == "stack":
        return
    here = package_of(module)
    assert here in FLOOR, f"{path.relative_to(STACK.parent)}: package {here!r} is on no floor of FLOORS"
    for line, imported, _ in stack_imports(path):
        there = package_of(imported) if imported.count(".") else "stack"
        assert there != "stack", f"{path.relative_to(STACK.parent)}:{line} imports the top package `stack`"
        assert there == here or FLOOR[there] < FLOOR[here], (
            f"{path.relative_to(STACK.parent)}:{line} imports {imported} ({there!r}, floor {FLOOR[there]}) from "
            f"{here!r} (floor {FLOOR[here]}): a package imports only floors below its own")


def test_no_import_cycle_between_modules():
    """Module-level and in-function imports alike: an import inside a function never dodges a cycle."""
    graph = {module_name(p): {m for _, m, _ in stack_imports(p)} for p in SOURCES}
    modules = set(graph)

    def resolve(m: str) -> str | None:  # `from stack.x import name` names the module stack.x
        while m and m not in modules:
            m = m.rpartition(".")[0]
        return m or None

    edges = {m: {r for r in map(resolve, targets) if r and r != m} for m, targets in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            assert state.get(n) != 1, f"import cycle: {' -> '.join([*trail[trail.index(n):], n])}"
            if n not in state:
                visit(n, [*trail, n])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(STACK)))
def test_an_import_inside_a_function_says_why(path):
    """Only to keep jax (or another heavy import) off a light path, with a comment saying so on the
    function's block of imports (any of its lines, or the line above it)."""
    lines = path.read_text().splitlines()
    def is_import(i: int) -> bool:  # an import line, or a blank line between two imports of the block
        blank_between = not lines[i].strip() and 0 < i < len(lines) - 1 and is_import(i - 1) and is_import(i + 1)
        return lines[i].lstrip().startswith(("import ", "from ")) or blank_between

    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    first, last = inner.lineno - 1, inner.end_lineno - 1
                    while first > 0 and is_import(first - 1):
                        first -= 1
                    while last + 1 < len(lines) and is_import(last + 1):
                        last += 1
                    assert any("#" in line for line in lines[first - 1:last + 1]), (
                        f"{path.relative_to(STACK.parent)}:{inner.lineno}: an import inside {node.name} "
                        "without a comment saying what it keeps off which path")


def test_stack_holds_at_most_three_top_level_modules():
    assert sorted(p.name for p in STACK.glob("*.py")) == ["__init__.py", "__main__.py", "errors.py"]


def test_the_engine_knows_only_the_algorithm_protocol():
    for path in STACK.joinpath("engine").rglob("*.py"):
        for line, imported, _ in stack_imports(path):
            assert not imported.startswith("stack.algorithms.") or imported == "stack.algorithms.base", (
                f"{path.relative_to(STACK.parent)}:{line} imports the concrete algorithm module {imported}")


def test_models_see_no_config_objects():
    for path in STACK.joinpath("models").rglob("*.py"):
        code = path.read_text()
        assert not re.search(r"^\s*(from|import) (omegaconf|hydra|stack\.config\.schema)", code, re.M), path.name


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(STACK)))
def test_docstrings_say_what_and_why_not_when(path):
    """A module docstring states the contract in at most 25 lines (the algorithm protocol and the
    algorithms' convention notes excepted); no docstring or comment carries a dated reading
    (measurements live in bench/README.md and commit messages)."""
    import io
    import tokenize

    text = path.read_text()
    tree = ast.parse(text)
    doc = ast.get_docstring(tree) or ""
    if path.parent.name != "algorithms":
        assert len(doc.splitlines()) <= 25, f"module docstring of {len(doc.splitlines())} lines"
    docs = [ast.get_docstring(n) or "" for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    dated = [d for d in docs + comments if re.search(r"\b20\d\d-\d\d-\d\d\b", d)]
    assert not dated, f"a dated reading: {dated[0][:200]!r}"


def test_tests_take_their_helpers_from_helpers_py():
    """Shared helpers live once in tests/helpers.py; conftest.py holds the session set-up and fixtures."""
    tests = STACK.parent / "tests"
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                where = f"{path.relative_to(tests)}:{node.lineno}"
                assert "conftest" not in (node.module or ""), f"{where} imports conftest"

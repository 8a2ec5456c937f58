"""The README stays a newcomer's map and docs/ its topic pages: the README is short and holds no
dated reading; every relative link of README.md, docs/*.md and bench/README.md resolves (file and
heading); the README's tables list every recipe and every config group with its options; its two
set-up commands are there; every docs page is linked from it. The last test shows that each check
catches what it looks for."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
SETUP = ('pip install -e ".[dev]" && python -m stack', 'pip install -e ".[dev]" && pytest')
DATED = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")  # a reading's date, as 2026-12-06
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """`text` without fenced code blocks and inline code (a `[x](y)` there is no link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: pathlib.Path) -> set[str]:
    """GitHub's ids of the headings of a markdown file: lowercase, punctuation dropped, spaces -> '-'."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M),
                          flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def broken_links(path: pathlib.Path) -> list[str]:
    """The relative links of a markdown file whose file, or heading (`#id`), does not exist."""
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file) if file else path
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    return broken


def table(text: str, heading: str) -> list[list[str]]:
    """The body rows (cells, backticks dropped) of the first table under `## heading`; [] if none."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    lines = [line for line in (match.group(1) if match else "").splitlines() if line.startswith("|")]
    return [[cell.strip().replace("`", "") for cell in line.strip("|").split("|")] for line in lines[2:]]


def listed(cell: str) -> set[str]:
    return {name.strip() for name in cell.split(",")}


def test_the_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail to docs/"


def test_the_readme_holds_no_dated_reading():
    dated = [line for line in README.read_text().splitlines() if DATED.search(line)]
    assert not dated, f"dated readings belong in docs/ or bench/README.md: {dated}"


@pytest.mark.parametrize("path", [README, *DOCS, REPO / "bench" / "README.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    assert not broken_links(path)


def test_every_recipe_is_in_the_recipes_table():
    recipes = {p.stem for p in REPO.joinpath("recipes").glob("*.yaml")}
    rows = {row[0] for row in table(README.read_text(), "Recipes")}
    assert recipes and rows == recipes, f"missing: {sorted(recipes - rows)}; not a recipe: {sorted(rows - recipes)}"


def test_every_config_group_is_in_the_groups_table_with_its_options():
    groups = {p.name: {y.stem for y in p.glob("*.yaml")} for p in REPO.joinpath("conf").iterdir()
              if p.is_dir() and any(p.glob("*.yaml"))}
    rows = {row[0]: listed(row[2]) for row in table(README.read_text(), "Config groups")}
    assert groups and set(rows) == set(groups), f"groups: {sorted(groups)}; in the README: {sorted(rows)}"
    assert rows == groups


def test_the_readme_gives_the_set_up_commands():
    """Each on a line of its own, as written (a comment after it may say what it does)."""
    text = README.read_text()
    assert [c for c in SETUP if not re.search(rf"^{re.escape(c)}( +#.*)?$", text, flags=re.M)] == []


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in LINK.findall(prose(README.read_text()))}
    assert DOCS and {p.resolve() for p in DOCS} <= linked


def test_the_checks_catch_what_they_look_for(tmp_path):
    assert DATED.search("on 2026-12-06, 0.635") and not DATED.search("v5e:2x4, 1e-5, 2x4x4, 12+7=19")
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n[ok](page.md) [here](#a-page) [gone](missing.md) [bad](#nowhere) "
                    "[web](https://x.org) `[code](not/a/link.md)`\n\n```\n[block](nor/this.md)\n```\n")
    assert broken_links(page) == ["missing.md", "#nowhere"]
    text = "## Recipes\n\n| recipe | x |\n|---|---|\n| `a` | 1 |\n| `b` | 2 |\n\n## Next\n\n| c |\n|---|\n| d |\n"
    assert [row[0] for row in table(text, "Recipes")] == ["a", "b"] and table(text, "Config groups") == []

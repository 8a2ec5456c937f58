"""Property (issue 15, item 11): any command line of schema keys, near-misses, group choices
and values of the wrong type either composes or raises the project's ConfigError with a
one-paragraph message — never another exception — within a fixed time per example."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, ListConfig

from stack.cli.app import preflight
from stack.config.schema import GROUPS
from stack.errors import ConfigError
from tests.helpers import make_cfg


def leaf_keys(node, prefix: str = "") -> list[str]:
    if isinstance(node, DictConfig):
        return [k for key in node.keys() for k in leaf_keys(node._get_node(key), f"{prefix}{key}.")]
    if isinstance(node, ListConfig):
        return [k for i in range(len(node)) for k in leaf_keys(node._get_node(i), f"{prefix}{i}.")]
    return [prefix.rstrip(".")]


KEYS = sorted(leaf_keys(make_cfg(["+recipe=llama_dpo"])))
near_miss = st.sampled_from(KEYS).flatmap(lambda k: st.integers(0, len(k) - 1).map(lambda i: k[:i] + k[i + 1:]))
key = st.one_of(st.sampled_from(KEYS), near_miss, st.sampled_from(GROUPS))
value = st.one_of(st.integers(-10**12, 10**12).map(str), st.floats(allow_nan=True).map(str), st.booleans().map(str),
                  st.text("abcxyz_.-/: 0123456789", max_size=20),
                  st.sampled_from(["null", "[1,2", "[]", "{a: 1}", "${oc.env:HOME}", "???", "", "'é'", "1e-4,3e-4",
                                   "llama_tiny", "cpu", "none", "interval(0,1)"]))
override = st.tuples(st.sampled_from(["", "+", "~"]), key, value).map(
    lambda t: t[0] + t[1] if t[0] == "~" else f"{t[0]}{t[1]}={t[2]}")


@settings(max_examples=60, deadline=10_000, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(override, min_size=1, max_size=3))
def test_composition_succeeds_or_raises_a_config_error(argv):
    try:
        preflight(argv)
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc) and len(str(exc)) < 2000, (argv, str(exc))
    except SystemExit as exc:  # argparse on a malformed command line
        pytest.fail(f"{argv}: SystemExit {exc.code}")

"""A mesh for a run of several processes (`stack.hardware.mesh.spanning_sizes`): mesh=auto's 1-device
default becomes data parallel over every device; a 1-device mesh named by the user is refused."""

import pytest

from stack.config.schema.mesh import MESH_AXES
from stack.errors import ConfigError
from stack.hardware.mesh import spanning_sizes
from tests.helpers import make_cfg


def test_auto_spans_every_process_as_data_parallel():
    ones = [1] * len(MESH_AXES)
    assert spanning_sizes(make_cfg().mesh, ones, 8) == [8, *ones[1:]]


def test_a_named_one_device_mesh_is_refused_with_the_way_out():
    with pytest.raises(ConfigError, match=r"mesh=single .* uses 1 of the 8 devices.*mesh=auto, mesh=dp"):
        spanning_sizes(make_cfg(["mesh=single"]).mesh, [1] * len(MESH_AXES), 8)

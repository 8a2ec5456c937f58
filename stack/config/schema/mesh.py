"""Schema of the `mesh` group: named device-mesh axes and logical-axis rules."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

MESH_AXES = ("data", "fsdp", "context", "tensor", "expert")

DEFAULT_RULES = {
    "batch": ["data", "fsdp"],  # activations and data: split over data and fsdp
    "length": None,
    "vocab": "tensor",
    "embed": "fsdp",  # params: sharded over fsdp (ZeRO-3 style), gathered per layer by XLA
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    # routed experts' stacking axis (stack.models.moe): null (replicated; as configs from before), or a mesh
    # axis of size > 1 for expert parallelism (e.g. "expert" with mesh.expert: 4)
    "expert": None,
}


@dataclass
class MeshConfig:
    name: str = "single"
    # Mesh axis sizes, in mesh order (MESH_AXES); one may be -1: fill the remaining devices.
    data: int = 1
    fsdp: int = 1
    # Context parallelism: each sequence split over this many devices (mesh=context sets the rules
    # that use it). Null: 1, not split (null, not 1, so that runs and expectations from before the key
    # compare equal: stack.checkpoint.manager.config_diff).
    context: Optional[int] = None
    tensor: int = 1
    # Expert parallelism: the routed experts split over this many devices (with rules.expert: expert).
    # Null: 1 (null for the same reason as context).
    expert: Optional[int] = None
    # Logical axis name -> mesh axis (a name, a list of names, or null = replicated).
    # The default table serves every mesh option; an option or override changes entries.
    rules: Dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_RULES))

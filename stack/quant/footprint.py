"""What the quantization saves, for `mode=compile`: the policy's weights and the optimizer state
per device, as built (quantized base, adapters) and as the same model in float with every
param trained (full fine-tuning), plus the policy's stored bits per parameter."""

from typing import Any

import jax
from flax import nnx

from stack.hardware.mesh import bits, bytes_per_device, layout_on, opt_state_shardings
from stack.models.init import abstract_model

GiB = 2**30


def _laid_out(tree: Any, mesh: Any, shardings: Any = None) -> Any:
    shardings = shardings if shardings is not None else jax.tree.map(lambda x: layout_on(mesh, x), tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _quantized_bits(tree: Any) -> str:
    """Stored bits per weight of the quantized matrices (codes + scales), e.g. `, its quantized
    matrices 4.25 bits/weight (224)`; empty when there are none."""
    flat = {tuple(map(str, k)): v for k, v in nnx.traversals.flatten_mapping(tree).items()}
    codes = {k[:-1]: v for k, v in flat.items() if k[-1] == "qvalue"}
    if not codes:
        return ""
    total = sum(v.size * bits(v.dtype) + flat[(*k, "scale")].size * bits(flat[(*k, "scale")].dtype)
                for k, v in codes.items())
    return f", its quantized matrices {total / sum(v.size for v in codes.values()):.2f} bits/weight ({len(codes)})"


def footprint(exp: Any, state: Any) -> str | None:
    """One line comparing `state` (the abstract TrainState) with full fine-tuning in float, or
    None when the two are the same (no quantization, no adapters)."""
    policy = [state.params.get("policy", {}), state.rest.get("policy", {})]
    stored = sum(x.size * bits(x.dtype) / 8 for x in jax.tree.leaves(policy))
    with jax.set_mesh(exp.mesh), nnx.logical_axis_rules(exp.rules):  # laid out as training lays it out
        plain = nnx.to_pure_dict(nnx.state(abstract_model(exp.cfg.model), nnx.Param))
    n_params = sum(x.size for x in jax.tree.leaves(plain))
    plain = _laid_out(plain, exp.mesh)
    full_opt = _laid_out(jax.eval_shape(exp.tx.init, plain), exp.mesh, opt_state_shardings(exp.tx, plain, exp.mesh))
    weights, float_weights = bytes_per_device(policy), bytes_per_device(plain)
    opt, float_opt = bytes_per_device(state.opt_state), bytes_per_device(full_opt)
    if (weights, opt) == (float_weights, float_opt):
        return None
    size = lambda b: f"{b / GiB:.3g} GiB" if b >= GiB / 10 else f"{b / 2**20:.3g} MiB"  # noqa: E731
    without = f"without it (float {exp.cfg.model.param_dtype}, every param trained)"
    return (f"quantization={exp.cfg.quantization.name}: policy weights {size(weights)} per device "
            f"({8 * stored / n_params:.2f} bits/param{_quantized_bits(policy[1])}), optimizer state "
            f"{size(opt)}; {without}: {size(float_weights)} and {size(float_opt)}")

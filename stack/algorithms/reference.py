"""The frozen reference of an algorithm (DPO, GRPO's KL, PPO): a copy of the initial policy,
the params of another stack run (`init_from`), or, when the quantization provider has a base
view (LoRA: adapters off), the policy itself seen without its adapters: no second copy."""

from typing import Any, Callable

from flax import nnx

from stack.errors import ConfigError
from stack.models.modules import copy_module, is_abstract


class Reference:
    def __init__(self, init_from: str | None = None):
        self.init_from = init_from
        self._base_view: Callable[[nnx.Module], nnx.Module] | None = None

    def setup(self, policy: nnx.Module, ctx: Any) -> dict[str, nnx.Module]:
        """The frozen modules to hold: {"reference": copy} or none (the base view serves)."""
        if ctx.quant.base is not None:
            if self.init_from:
                raise ConfigError("'algorithm.reference.init_from' cannot be combined with adapters "
                                  "(LoRA/QLoRA): the reference is the base model with adapters off.")
            self._base_view = ctx.quant.base
            return {}
        reference = copy_module(policy)
        if self.init_from and not is_abstract(policy):  # mode=compile: shapes only
            from stack.checkpoint import load_params

            load_params(reference, self.init_from)
        return {"reference": reference}

    def model(self, models: Any, frozen: Any) -> nnx.Module:
        """The reference model inside a jitted function: the frozen copy, or the base view."""
        return self._base_view(models.policy) if self._base_view is not None else frozen.reference

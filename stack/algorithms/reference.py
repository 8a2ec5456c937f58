"""The frozen reference of an algorithm (DPO, GRPO's KL, PPO): a copy of the initial policy,
the params of another stack run or of a Hugging Face Llama dir (`init_from`: RUN/checkpoints or
hf:DIR, checked against the model config like `model.init_from`), or, when the quantization provider has a base
view (LoRA: adapters off), the policy itself seen without its adapters: no second copy."""

from typing import Any, Callable

from flax import nnx

from stack.checkpoint.saved_params import load_params
from stack.errors import ConfigError
from stack.models.hf import load_hf_weights
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
            _load(reference, self.init_from, ctx.model)
        return {"reference": reference}

    def model(self, models: Any, frozen: Any) -> nnx.Module:
        """The reference model inside a jitted function: the frozen copy, or the base view."""
        return self._base_view(models.policy) if self._base_view is not None else frozen.reference


def _load(reference: nnx.Module, init_from: str, model_cfg: Any) -> None:
    """`init_from`'s params into `reference`: hf:DIR (its config.json must match `model_cfg`) or a
    stack run's checkpoints dir."""
    if init_from.startswith("hf:"):
        if model_cfg is None:
            raise ConfigError(f"'algorithm.reference.init_from'={init_from!r}: a Hugging Face reference needs the "
                              "run's model config to check config.json against.")
        load_hf_weights(reference, model_cfg, init_from)
    else:
        load_params(reference, init_from)

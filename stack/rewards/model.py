"""`reward=model`: a trained reward model (a run of `algorithm=rm`) scoring completions on device.

The `reward` group builds `ModelReward(init_from)`; GRPO and PPO load it (`load`) as a frozen
module (stack.algorithms.onpolicy.reward_model) and read the score at each completion's last
token. The reward model must share the policy's tokenizer (as in TRL's PPOTrainer). On the host,
`score_texts(path, prompts, completions)` scores text encoded as the RM's pipeline encodes a
plain-text preference pair's side (BOS, the prompt, the completion, EOS):

    from stack.rewards.model import score_texts
    score_texts("runs/rm/checkpoints", ["copy abc="], ["abc"])   # -> array([2.7], dtype=float32)
    score_texts("hf:path/to/trl_reward_model", ["copy abc="], ["abc"])
"""

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from omegaconf import DictConfig, OmegaConf

from stack.checkpoint.policy import load_policy, run_config
from stack.checkpoint.saved_params import assign_params
from stack.config.hf_config import hf_config_to_model, hf_model_config, read_config
from stack.data.encode import Encoder
from stack.data.tokenizers import dir_tokenizer, make_tokenizer
from stack.errors import ConfigError
from stack.models.heads import ScalarHead, at_last
from stack.models.hf import load_hf_reward
from stack.models.init import abstract_model


def pair_rows(batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(tokens, segments) [2B, T+1] of preference rows [B, 2, T]: the whole sequence of each
    side (the first input, then the targets), 1 on its real tokens."""
    inputs, targets, segments = (batch[k].reshape(-1, batch[k].shape[-1]) for k in ("inputs", "targets",
                                                                                   "segment_ids"))
    tokens = jnp.concatenate([inputs[:, :1], targets], -1)
    return tokens, jnp.concatenate([jnp.ones_like(segments[:, :1]), segments], -1)


class RewardScorer(nnx.Module):
    """A Llama trunk and the scalar head of a reward model: tokens -> a score per row."""

    def __init__(self, trunk: nnx.Module, head: ScalarHead):
        self.trunk, self.head = trunk, head

    def __call__(self, tokens: jax.Array, segments: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """Scores [B] of rows [B, T] at each row's last real token (`segments` > 0)."""
        return at_last(self.head(self.trunk(tokens, positions, segments, features=True)), segments)


@dataclass(frozen=True)
class ModelReward:
    """The reward model of a checkpoints dir written by an `algorithm=rm` run, or `hf:DIR`: a
    Hugging Face LlamaForSequenceClassification with one label (TRL RewardTrainer's output,
    `stack.tools.hf export` of an RM run); with `rules`, rule functions scored beside it on the host
    (TRL's reward_funcs mixing models and functions), the model's score weighted by `weight`."""

    init_from: str
    key: str = "'reward.init_from'"  # how errors name init_from (the stack.tools.generate --score path)
    rules: Any = None  # a stack.rewards.RewardRunner, or None: the model alone
    weight: float = 1.0

    def run_config(self) -> DictConfig:
        """The resolved config of the run that wrote the checkpoints (its `config.yaml`)."""
        if self.init_from.startswith("hf:"):
            raise ConfigError(f"{self.key}={self.init_from!r} is a Hugging Face reward model; this needs the "
                              "checkpoints of an algorithm=rm run (RUN/checkpoints).")
        cfg = run_config(self.init_from, key=f"{self.key}=")
        if cfg.algorithm.name != "rm":
            raise ConfigError(f"{self.key}={self.init_from!r} was written by algorithm="
                              f"{cfg.algorithm.name!r}, not a reward model (algorithm=rm).")
        return cfg

    def reader(self) -> tuple[Any, DictConfig]:
        """The tokenizer and `model` config it reads text with: its run's, or for `hf:DIR` the dir's
        `config.json` and `tokenizer.json` (the byte tokenizer without one, as stack.tools.generate)."""
        if self.init_from.startswith("hf:"):
            return dir_tokenizer(self.init_from.removeprefix("hf:")), hf_model_config(self.init_from, reward=True)
        cfg = self.run_config()
        return make_tokenizer(cfg.data.tokenizer), cfg.model

    def close(self) -> None:
        """The rule functions' workers (the reward model lives in the run's frozen modules)."""
        if self.rules is not None:
            self.rules.close()

    def load(self, abstract: bool = False, policy_cfg: DictConfig | None = None) -> RewardScorer:
        """The reward model with its trained params (shape-only when `abstract`: mode=compile);
        `policy_cfg` (the policy's `model` config) gives an `hf:` model its dtypes."""
        if self.init_from.startswith("hf:"):
            return self._load_hf(abstract, policy_cfg)
        model_cfg = self.run_config().model
        with nnx.use_eager_sharding(False):
            if abstract:  # no concrete array: the mesh may be a compile-only TPU topology
                return RewardScorer(abstract_model(model_cfg), nnx.eval_shape(lambda: ScalarHead(model_cfg.d_model)))
            head = ScalarHead(model_cfg.d_model)
        trunk, _, saved = load_policy(self.init_from)  # a LoRA-trained RM: adapters merged into the trunk
        if "score" not in saved.tree:
            raise ConfigError(f"{self.key}={self.init_from!r} (step {saved.step}) holds no `score` head.")
        assign_params(head, saved.tree["score"], f"{self.init_from}/{saved.step}")
        return RewardScorer(trunk, head)

    def _load_hf(self, abstract: bool, policy_cfg: DictConfig) -> RewardScorer:
        model_cfg = OmegaConf.merge(policy_cfg, hf_config_to_model(read_config(self.init_from), reward=True))
        trunk = abstract_model(model_cfg)  # sharded as the policy is, under the run's mesh
        with nnx.use_eager_sharding(False):
            head = nnx.eval_shape(lambda: ScalarHead(model_cfg.d_model))
        if not abstract:
            load_hf_reward(trunk, head, model_cfg, self.init_from)
        return RewardScorer(trunk, head)


def score_texts(path: str, prompts: list[str], completions: list[str]) -> np.ndarray:
    """The reward model's float32 score of each (prompt, completion), encoded as its data encoded a
    pair's side; `path`: an algorithm=rm run's checkpoints or `hf:DIR` (TRL RewardTrainer's output)."""
    reward = ModelReward(path, key="--score's reward model (an algorithm=rm run's checkpoints or a HF dir)")
    tokenizer, model_cfg = reward.reader()
    scorer = reward.load(policy_cfg=model_cfg)
    # plain-text pairs are BOS, prompt, completion, EOS: no chat template renders them
    encoder = Encoder("preference", tokenizer, "simple", model_cfg.max_seq_len - 1, "keep_end")
    rows = [encoder.encode({"prompt": p, "chosen": c, "rejected": c}, f"text {i}")
            for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    width = 2 + max(int(r["segment_ids"][0].sum()) for r in rows)  # the longest sequence, padded
    tokens, segments = pair_rows({k: jnp.asarray(np.stack([r[k] for r in rows])[..., :width - 1])
                                  for k in ("inputs", "targets", "segment_ids")})
    return np.asarray(nnx.jit(lambda m, t, s: m(t, s))(scorer, tokens[0::2], segments[0::2]))

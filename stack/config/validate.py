"""Checks on a composed config that need no jax: they run before any compute."""

import dataclasses
from importlib.resources import files
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from stack.config.attention import check_attention
from stack.config.hf_config import hf_config_to_model, read_config
from stack.config.mesh import check_context, check_rules
from stack.config.model_family import check_family
from stack.config.quantization import check_config, check_training
from stack.config.rollout import check_rollout
from stack.config.sampled_eval import check_eval
from stack.config.schema import CONFIG_MODULE, GROUPS
from stack.config.targets import check_reward_function, check_targets
from stack.errors import ConfigError, bad_choice, unknown_key

CHOICES = {
    "mode": ("train", "compile", "validate"),
    "data.source": ("synthetic", "jsonl", "parquet", "arrayrecord", "hf_disk"),
    "data.kind": ("text", "sft", "preference", "prompt"),
    "data.truncation": ("keep_start", "keep_end", "error"),
    "data.chat_template": ("simple", "chatml", "llama3", "tokenizer"),
    "logger.mode": ("offline", "online", "disabled"),
    "trainer.nan_policy": ("stop", "ignore"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.param_dtype": ("float32", "bfloat16", "float16"),
    "model.rope_scaling.type": ("default", "llama3", "linear"),
    "model.remat": ("none", "full", "dots"),
    "checkpoint.name": ("none", "local", "persistent", "multi_tier"),
    "hardware.platform": ("cpu", "gpu", "tpu"),
}

POSITIVE = ("trainer.steps", "trainer.grad_accum", "trainer.log_every", "trainer.eval_batches",
            "data.seq_len", "data.batch_size", "model.d_model", "model.n_layers",
            "model.n_heads", "model.n_kv_heads", "model.d_ff", "model.vocab_size")


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError for the first problem found in `cfg`."""
    for group in GROUPS:
        if not isinstance(cfg.get(group), DictConfig):
            raise ConfigError(f"The '{group}' group has no option (was it deleted with ~{group}?); every run needs "
                              f"one: choose it with {group}=NAME (python -m stack --info defaults lists them).")
    _check_schema_keys(cfg, "")
    if cfg.model.name == "hf" and cfg.model.path is None:
        raise ConfigError("'model.path' is required: model=hf reads the architecture and weights from a local Hugging "
                          "Face Llama directory (model.path=/models/Llama-3.2-1B, holding config.json).")
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise bad_choice(key, value, allowed)
    for key in POSITIVE:
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"'{key}' must be a positive integer, got {value!r}.")
    m = cfg.model
    _check_model(m, cfg.data.seq_len)
    check_family(m)
    check_rules(cfg.mesh, m.get("num_experts"))
    check_attention(m, cfg.hardware.platform, cfg.data.seq_len, check_context(cfg.mesh, cfg.data.seq_len))
    if m.scan_layers and cfg.quantization.method != "none":
        raise ConfigError(
            f"model.scan_layers=true cannot run with quantization.method={cfg.quantization.method!r}: Qwix "
            "intercepts each layer's projections by module path, and a scan runs one merged copy of a layer. "
            "Set model.scan_layers=false (unrolled layers) or quantization=none.")
    if cfg.trainer.eval_every < 0:
        raise ConfigError(f"'trainer.eval_every'={cfg.trainer.eval_every} must be >= 0 "
                          "(0: only at the start and the end).")
    _check_rope(m.rope_scaling)
    _check_optimizer(cfg.optimizer)
    _check_data_kind(cfg)  # before the data's own keys: a recipe's keys for another kind are then explained
    _check_data(cfg.data)
    _check_checkpoint(cfg.checkpoint)
    _check_profile(cfg.trainer.profile, cfg.trainer.steps)
    check_config(cfg.quantization)
    check_training(cfg.quantization)
    _check_algorithm(cfg)
    _check_reward(cfg)
    check_eval(cfg)
    check_rollout(cfg)
    check_targets(cfg, tuple(cfg.allow_targets), objects=False)  # build() judges the objects


def _check_model(m: DictConfig, seq_len: int) -> None:
    """Head shapes that attention and RoPE can use, and rows that fit the model's context."""
    if m.n_heads % m.n_kv_heads:
        raise ConfigError(
            f"'model.n_kv_heads'={m.n_kv_heads} must divide 'model.n_heads'={m.n_heads} "
            "(grouped-query attention shares each key/value head across n_heads/n_kv_heads heads)."
        )
    if m.head_dim is None and m.d_model % m.n_heads:
        raise ConfigError(
            f"'model.d_model'={m.d_model} is not divisible by 'model.n_heads'={m.n_heads}; "
            "set 'model.head_dim' explicitly or pick sizes that divide."
        )
    head_dim = m.head_dim if m.head_dim is not None else m.d_model // m.n_heads
    if head_dim < 2 or head_dim % 2:
        key = "'model.head_dim'" if m.head_dim is not None else f"d_model/n_heads ({m.d_model}/{m.n_heads})"
        raise ConfigError(f"The head size {key}={head_dim} must be even and >= 2: RoPE rotates pairs of dimensions.")
    if not m.rope_theta > 0:
        raise ConfigError(f"'model.rope_theta'={m.rope_theta} must be > 0, RoPE's base wavelength (Llama 3: 500000).")
    if seq_len > m.max_seq_len:
        raise ConfigError(f"'data.seq_len'={seq_len} exceeds 'model.max_seq_len'={m.max_seq_len}, the model's context "
                          "(HF max_position_embeddings): lower data.seq_len or raise model.max_seq_len.")


def _check_rope(s: DictConfig) -> None:
    """llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and a positive
    original context (transformers divides by high - low)."""
    if s.type == "llama3" and not (s.factor >= 1 and 0 < s.low_freq_factor < s.high_freq_factor
                                   and s.original_max_position_embeddings > 0):
        raise ConfigError(
            f"'model.rope_scaling'={OmegaConf.to_container(s)} is not a valid llama3 scaling: it needs factor >= 1, "
            "0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0.")


def _check_reward(cfg: DictConfig) -> None:
    r = cfg.reward
    if r.name == "model" and r.init_from is None:
        raise ConfigError("'reward.init_from' is required: reward=model scores with a reward model, the "
                          "checkpoints dir of an algorithm=rm run (e.g. +recipe=llama_rm): "
                          "reward.init_from=RUN/checkpoints.")
    model = r.init_from is not None  # a run's checkpoints are checked when loaded (stack.rewards.model)
    if model and r.init_from.startswith("hf:"):
        _check_hf_reward(r.init_from, cfg.model.vocab_size)
    if not r.functions and not model and cfg.env.environment is None:  # an environment may reward alone
        raise ConfigError("'reward.functions' is empty: list at least one (accuracy, format, length, or "
                          "pkg.module.fn), or score with a reward model "
                          "(reward=model reward.init_from=RUN/checkpoints).")
    for name in r.functions:
        check_reward_function(name, tuple(cfg.allow_targets))  # by its text; make_rewards judges the object
    scorers = [*r.functions, *([f"the reward model {r.init_from!r}"] if model else [])]
    if r.weights is not None and len(r.weights) != len(scorers):
        raise ConfigError(f"'reward.weights' has {len(r.weights)} entries for {len(scorers)} scorers ({scorers}); "
                          "give one weight per function, the reward model's last, or null (1.0 each).")
    if not r.timeout > 0:
        raise ConfigError(f"'reward.timeout'={r.timeout} must be > 0 (seconds per batch).")


def _check_hf_reward(path: str, vocab_size: int) -> None:
    """`reward.init_from=hf:DIR`: a one-label LlamaForSequenceClassification over the policy's vocabulary."""
    try:
        theirs = hf_config_to_model(read_config(path), reward=True)["vocab_size"]
    except ConfigError as exc:
        raise ConfigError(f"'reward.init_from'={path!r}: {exc}") from None
    if theirs != vocab_size:
        raise ConfigError(f"'reward.init_from'={path!r} has vocab_size={theirs} and the policy model.vocab_size="
                          f"{vocab_size}: the reward model reads the policy's tokens, so it must share its tokenizer "
                          "(as TRL's PPOTrainer requires).")


def _check_data_kind(cfg: DictConfig) -> None:
    """The data the algorithm reads, as its schema states it."""
    schema = OmegaConf.get_type(cfg.algorithm)
    if cfg.data.kind not in schema.data_kinds:
        options = [f"data={o}" for o in data_options(schema.data_kinds)]
        raise ConfigError(
            f"'data.kind'={cfg.data.kind!r} does not fit algorithm={cfg.algorithm.name!r}, which reads "
            f"{' or '.join(schema.data_kinds)} records; pick a data option of that kind ({', '.join(options)}), "
            f"or set data.kind={schema.data_kinds[0]} for records of that schema in your data.path.")


def data_options(kinds: tuple[str, ...]) -> list[str]:
    """The shipped `data` options (conf/data/*.yaml) whose records are of one of `kinds`."""
    folder = files(CONFIG_MODULE).joinpath("data")
    return sorted(p.name[:-5] for p in folder.iterdir()
                  if p.name.endswith(".yaml") and OmegaConf.create(p.read_text()).get("kind") in kinds)


def _check_algorithm(cfg: DictConfig) -> None:
    """The algorithm's own rules, as its schema states them."""
    schema = OmegaConf.get_type(cfg.algorithm)
    schema.check(cfg.algorithm, cfg)
    if cfg.data.share_prompt and not schema.shared_prompt_rows:
        raise ConfigError(f"'data.share_prompt'=true lays pairs out for algorithm=dpo; algorithm="
                          f"{cfg.algorithm.name!r} reads separate chosen and rejected rows "
                          "(set data.share_prompt=false).")


UNIT_INTERVAL = ("b1", "b2", "momentum")  # `optimizer.extra` knobs of the shipped chains, in [0, 1)


def _check_optimizer(o: DictConfig) -> None:
    """The named knobs that every shipped chain reads, and the `extra` ones it knows."""
    if not o.clip_norm > 0:  # optax would scale every gradient by clip_norm / norm: 0 zeroes them, < 0 flips them
        raise ConfigError(f"'optimizer.clip_norm'={o.clip_norm} must be > 0, the largest global gradient norm "
                          "kept (TRL max_grad_norm); optimizer.clip_norm=inf clips nothing.")
    for key in ("lr", "weight_decay", "warmup_steps"):
        if o[key] < 0:
            raise ConfigError(f"'optimizer.{key}'={o[key]} must be >= 0.")
    for key in UNIT_INTERVAL:
        if key in o.extra and not 0 <= o.extra[key] < 1:
            raise ConfigError(f"'optimizer.extra.{key}'={o.extra[key]} must be in [0, 1) (a decay rate).")
    if "eps" in o.extra and not o.extra.eps > 0:
        raise ConfigError(f"'optimizer.extra.eps'={o.extra.eps} must be > 0.")


def _check_data(d: DictConfig) -> None:
    if d.source == "synthetic":
        if d.kind != "sft":
            raise ConfigError(f"'data.kind'={d.kind!r}: data.source=synthetic makes sft records only.")
        if d.path or d.eval_path:  # it was ignored: the run trained on a+b= problems
            raise ConfigError("'data.path' is set but data.source=synthetic generates its records and reads no file: "
                              "pick an option that reads it (data=jsonl_sft, jsonl_prefs, jsonl_prompts, parquet_sft).")
        if d.max_operand < 2:  # fewer leave the train split (~90 % of the a+b problems) empty
            raise ConfigError(f"'data.max_operand'={d.max_operand} must be >= 2: data.source=synthetic makes the "
                              "problems a+b= with 0 <= a, b < max_operand.")
    elif not d.path:
        raise ConfigError(f"'data.path' is required for data.source={d.source!r}.")
    for key in ("path", "eval_path"):
        value = d[key]
        if value is not None and not isinstance(value, str) and not (
                isinstance(value, ListConfig) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"'data.{key}'={value!r}: expected a path, a glob pattern or a list of them.")
    if d.chat_template == "tokenizer" and d.tokenizer == "byte":
        raise ConfigError("'data.chat_template'=tokenizer renders messages with the tokenizer's own Jinja template, "
                          "but 'data.tokenizer'=byte (built in) has none: set data.tokenizer=DIR (a Hugging Face "
                          "tokenizer dir with a chat template) or pick simple, chatml or llama3.")
    if d.packing and d.kind not in ("text", "sft"):
        raise ConfigError(f"'data.packing'=true works for data.kind text and sft, not {d.kind!r} "
                          "(preference pairs and prompts are padded).")
    if d.train_on_input and d.kind in ("preference", "prompt"):
        raise ConfigError(f"'data.train_on_input'=true (loss on the prompt too) applies to data.kind=sft, not "
                          f"{d.kind!r}: a pair or a prompt learns its completions only (set it to false).")
    _check_completion_len(d)
    if not 0.0 <= d.max_bad_fraction < 1.0:
        raise ConfigError(f"'data.max_bad_fraction'={d.max_bad_fraction} must be in [0, 1).")
    if not d.eval_path and not 0.0 < d.eval_fraction < 1.0:
        raise ConfigError(f"'data.eval_fraction'={d.eval_fraction} must be in (0, 1): every run evaluates (the "
                          "eval curves and a sweep's objective); to train on every record of data.path, give the "
                          "held-out records as data.eval_path.")
    for key in ("workers", "read_threads", "prefetch"):
        if d[key] < 0:
            raise ConfigError(f"'data.{key}'={d[key]} must be >= 0.")


def _check_completion_len(d: DictConfig) -> None:
    """`data.max_completion_len`: null, or an int in [1, seq_len) for preference data."""
    k = d.max_completion_len
    if d.share_prompt and k is None:
        raise ConfigError("'data.share_prompt'=true needs data.max_completion_len (the completion tokens kept "
                          "per pair; set it, e.g. data.max_completion_len=128).")
    if k is None:
        return
    if d.kind != "preference":
        raise ConfigError(f"'data.max_completion_len'={k!r} applies to data.kind=preference, not {d.kind!r} "
                          "(set it to null).")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k < d.seq_len:
        raise ConfigError(f"'data.max_completion_len'={k!r}: expected null or an integer in [1, data.seq_len="
                          f"{d.seq_len}), the loss tokens kept of each completion (TRL max_completion_length).")


def _check_checkpoint(c: DictConfig) -> None:
    if c.name == "persistent" and not c.path:
        raise ConfigError("'checkpoint.path' is required for checkpoint=persistent (a durable path or URI).")
    if c.name == "multi_tier" and not (c.persistent and c.persistent.path):
        raise ConfigError("'checkpoint.persistent.path' is required for checkpoint=multi_tier (the durable tier).")
    for key in ("every", "persistent.every"):
        value = OmegaConf.select(c, key)
        if value is not None and value < 0:
            raise ConfigError(f"'checkpoint.{key}'={value} must be >= 0 (0: only the final save).")
    for key in ("keep", "persistent.keep"):
        value = OmegaConf.select(c, key)
        if value is not None and value < 1:
            raise ConfigError(f"'checkpoint.{key}'={value} must be >= 1.")
    if not c.resume:
        raise ConfigError("'checkpoint.resume' must be auto, never, or the path of a checkpoints dir.")


def _check_schema_keys(node: Any, prefix: str) -> None:
    """Reject keys added with `+key=...` that the node's dataclass schema does not declare."""
    if isinstance(node, ListConfig):
        return
    if not isinstance(node, DictConfig):
        return
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        fields = {f.name for f in dataclasses.fields(schema)}
        for key in node.keys():
            if key not in fields:
                raise unknown_key(f"{prefix}{key}", fields)
    for key in node.keys():
        if OmegaConf.is_missing(node, key):
            continue
        _check_schema_keys(node._get_node(key), f"{prefix}{key}.")


def _check_profile(profile: Any, steps: int) -> None:
    """`trainer.profile`: null, or [START, STOP] with 1 <= START <= STOP <= trainer.steps."""
    if profile is None:
        return
    ok = isinstance(profile, ListConfig | list) and len(profile) == 2 and all(
        isinstance(s, int) and not isinstance(s, bool) for s in profile)
    if not ok or not 1 <= profile[0] <= profile[1] <= steps:
        raise ConfigError(f"'trainer.profile'={list(profile) if ok else profile!r}: expected [START,STOP], the "
                          f"first and last optimizer step to trace, with 1 <= START <= STOP <= trainer.steps "
                          f"({steps}), e.g. trainer.profile=[5,7]; null: no trace.")

"""The `quantization` group's config checked on its own (no jax import: runs before anything
is built): the method, each rule's qtypes, calibration, tile size and LoRA fields."""

from typing import Any

from stack.errors import ConfigError, bad_choice

QTYPES = ("int8", "int4", "fp8", "nf4")  # weights (nf4: 4-bit NormalFloat, weights only)
ACT_QTYPES = ("int8", "int4", "fp8")
CALIBRATIONS = ("absmax", "minmax", "rms", "fixed")  # Qwix's methods, written `absmax`, `rms,0.9`, ...
METHODS = ("none", "qat", "ptq", "lora")


def check_config(q: Any) -> None:
    """The group's config on its own: method, rule fields, qtypes (before anything is built)."""
    if q.method not in METHODS:
        raise bad_choice("quantization.method", q.method, METHODS)
    if q.method == "none":
        if q.rules:
            raise ConfigError("'quantization.rules' is set but quantization.method=none; pick a quantization "
                              "option (int8_qat, w8_ptq, lora, qlora_nf4, ...) or set the method.")
        return
    if not q.rules:
        raise ConfigError(f"'quantization.rules' is empty for quantization.method={q.method!r}: list at least one "
                          "rule (module_path regex, weight_qtype, ...).")
    if q.calibration_batches < 1:
        raise ConfigError(f"'quantization.calibration_batches'={q.calibration_batches} must be >= 1.")
    for i, r in enumerate(q.rules):
        _check_rule(f"quantization.rules.{i}", r, q.method)


def _check_rule(key: str, r: Any, method: str) -> None:
    if r.weight_qtype is not None and r.weight_qtype not in QTYPES:
        raise bad_choice(f"{key}.weight_qtype", r.weight_qtype, ("null", *QTYPES))
    if r.act_qtype is not None and r.act_qtype not in ACT_QTYPES:
        raise bad_choice(f"{key}.act_qtype", r.act_qtype, ("null", *ACT_QTYPES))
    for field in ("weight_calibration", "act_calibration"):
        if str(r[field]).split(",")[0] not in CALIBRATIONS:
            raise bad_choice(f"{key}.{field}", r[field], CALIBRATIONS)
    if method == "lora":
        if r.rank < 1:
            raise ConfigError(f"'{key}.rank'={r.rank} must be a positive integer.")
        if not r.alpha > 0:
            raise ConfigError(f"'{key}.alpha'={r.alpha} must be > 0.")
        if r.act_qtype is not None:
            raise ConfigError(f"'{key}.act_qtype'={r.act_qtype!r}: LoRA/QLoRA quantize the frozen base weights "
                              "only; use quantization=int8_qat for quantized activations.")
    elif r.weight_qtype is None:
        raise ConfigError(f"'{key}.weight_qtype' is null for quantization.method={method!r}: set one of "
                          f"{', '.join(QTYPES)}.")
    if r.weight_qtype in ("nf4", "int4") and not r.tile_size:
        raise ConfigError(f"'{key}.tile_size' is required for weight_qtype={r.weight_qtype!r} "
                          "(4-bit weights are scaled per tile of the contraction dim, e.g. 64).")
    if r.tile_size is not None and r.tile_size < 1:
        raise ConfigError(f"'{key}.tile_size'={r.tile_size} must be a positive integer.")


def check_training(q: Any) -> None:
    """A training run's quantization: post-training quantization is its own command."""
    if q.method == "ptq":
        raise ConfigError(f"quantization={q.name} (method ptq) is post-training quantization, not a way to train: "
                          f"train in float, then run `python -m stack.tools.quantize RUN/checkpoints "
                          f"quantization={q.name} --out DIR`. To train with quantization, pick int8_qat, int4_qat, "
                          "fp8_qat, lora or qlora_nf4.")


def has_adapters(q: Any) -> bool:
    """Whether the run trains adapters on a frozen base (LoRA/QLoRA): its checkpoints hold the
    adapters only, and the base model is the policy with its adapters off."""
    return q.method == "lora"


def is_post_training(q: Any) -> bool:
    """Whether the config is post-training quantization (`python -m stack.tools.quantize`'s output:
    its checkpoint holds quantized weights and static activation scales)."""
    return q.method == "ptq"

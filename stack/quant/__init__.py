"""Quantization: the `quantization` group's Qwix rules as one provider object (QAT, PTQ, LoRA,
QLoRA, none) that the rest of the code asks; nothing outside `stack/quant*` tests a method's
name. `config` checks the group's config (no jax), `rules` checks rules against a model and
builds Qwix rules, `providers` holds the provider classes, `merge` folds LoRA adapters into
their base weights for export (and a PTQ model's back to float), `ptq` is post-training
quantization with calibrated activation scales and its report (`python -m stack.tools.quantize`),
`footprint` is what `mode=compile` reports the quantization saves.
"""

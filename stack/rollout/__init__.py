"""Generation with a KV cache: a jitted prefill, then a decode loop on device (stack.rollout.generate)."""

from stack.rollout.generate import Rollout, generate, sample_keys
from stack.rollout.sampling import Sampling, filter_logits, sample_token

__all__ = ["Rollout", "Sampling", "filter_logits", "generate", "sample_keys", "sample_token"]

"""Generation with a KV cache: a jitted prefill, then a decode loop on device, by the static engine
(stack.rollout.generate) or continuous batching over a paged cache (stack.rollout.paged)."""

from stack.rollout.generate import Rollout, generate, sample_keys
from stack.rollout.paged import Paging, paging_of
from stack.rollout.sampling import Sampling, filter_logits, sample_token

__all__ = ["Paging", "Rollout", "Sampling", "filter_logits", "generate", "paging_of", "sample_keys", "sample_token"]

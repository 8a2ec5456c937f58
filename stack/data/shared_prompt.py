"""Preference pairs as rows the model scores at chosen positions only, with or without sharing the
prompt between the two completions (`data.max_completion_len`, `data.share_prompt`).

Every such row carries, per completion (chosen, rejected) and at most K = max_completion_len
tokens each: `completion_positions` [2, K] (the input position whose output predicts the token),
`completion_targets` [2, K] and `completion_mask` [2, K] (its loss flag; 0 on padding).

`share_prompt` (prefix sharing, as in "Accelerating Direct Preference Optimization with Prefix
Sharing", Wang et al. 2024): one row per pair, seq_len + K wide, holding the prompt once and both
completions after it: prompt | chosen | rejected, the last token of each completion left out (it
is only a target). `segment_ids` are 1 (prompt), 2 (chosen), 3 (rejected), 0 (padding) and
`parent_ids` 1 on real tokens: a token attends to earlier tokens of its own segment or of its
parent's, so the rejected completion sees the prompt and not the chosen one. Positions restart
after the prompt for each completion. The log-probs are those of the two separate rows.
"""

import numpy as np

from stack.errors import DataError

Row = dict[str, np.ndarray]


def completion_arrays(targets: np.ndarray, loss_mask: np.ndarray, k: int) -> Row:
    """One separate row's [k] positions, targets and flags of its loss tokens (at most k of them),
    padded with the first loss-free position (flag 0)."""
    at = np.flatnonzero(loss_mask)
    at = np.concatenate([at, np.full(k - len(at), int(np.argmin(loss_mask > 0)))]).astype(np.int32)
    return {"completion_positions": at, "completion_targets": targets[at], "completion_mask": loss_mask[at]}


def _split(ids: list[int], flags: list[int], k: int) -> tuple[list[int], list[int], list[int]]:
    """(prompt, completion, its flags): the completion runs from the first loss token after the
    first token to the last loss token, at most k tokens."""
    first = next(i for i in range(1, len(flags)) if flags[i])
    last = max(i for i, f in enumerate(flags) if f)
    end = min(last + 1, first + k)
    return ids[:first], ids[first:end], flags[first:end]


def _padded(values: list[int], k: int, dtype: type) -> np.ndarray:
    out = np.zeros(k, dtype)
    out[: len(values)] = values
    return out


def shared_row(chosen: tuple[list[int], list[int]], rejected: tuple[list[int], list[int]], k: int,
               width: int, pad_id: int, where: str) -> Row:
    """The pair's one row (module doc) from each side's (ids, loss flags), already truncated."""
    (prompt, comp_c, flags_c), (prompt_r, comp_r, flags_r) = _split(*chosen, k), _split(*rejected, k)
    if prompt != prompt_r:
        raise DataError(f"{where}: the chosen and rejected rows tokenize the prompt differently, so "
                        "data.share_prompt=true cannot share it (set data.share_prompt=false).")
    p, lc, lr = len(prompt), len(comp_c), len(comp_r)
    tokens = prompt + comp_c[:-1] + comp_r[:-1]
    assert len(tokens) <= width, (len(tokens), width)
    row = {"inputs": _padded(tokens, width, np.int32),
           "positions": _padded([*range(p + lc - 1), *range(p, p + lr - 1)], width, np.int32),
           "segment_ids": _padded([1] * p + [2] * (lc - 1) + [3] * (lr - 1), width, np.int32),
           "parent_ids": _padded([1] * len(tokens), width, np.int32)}
    row["inputs"][len(tokens):] = pad_id
    at_c = [p - 1 + j for j in range(lc)]
    at_r = [p - 1] + [p + lc - 2 + j for j in range(1, lr)]
    row["completion_positions"] = np.stack([_padded(at_c, k, np.int32), _padded(at_r, k, np.int32)])
    row["completion_targets"] = np.stack([_padded(comp_c, k, np.int32), _padded(comp_r, k, np.int32)])
    row["completion_mask"] = np.stack([_padded(flags_c, k, np.float32), _padded(flags_r, k, np.float32)])
    return row

"""The exported config.json is the one transformers writes itself, and transformers loads the
export without a warning (transformers' own `save_pretrained` output is the reference)."""

import json
import logging
import warnings

import pytest

transformers = pytest.importorskip("transformers", reason="HF interop tests need transformers")
torch = pytest.importorskip("torch", reason="HF interop tests need torch (CPU)")

from stack.models.hf import export_hf  # noqa: E402
from tests.unit.test_hf import SCALING, our_cfg, randomized  # noqa: E402

SPECIALS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


class Captured(logging.Handler):
    """Every record of level WARNING or above that transformers' loggers emit."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


@pytest.mark.parametrize("tie,scaling,dtype", [(False, None, "float32"), (True, SCALING, "bfloat16")])
def test_config_json_is_the_form_transformers_writes(tie, scaling, dtype, tmp_path):
    cfg = our_cfg(tie, scaling)
    export_hf(randomized(cfg), cfg, str(tmp_path / "ours"), dtype=dtype, specials=SPECIALS)
    ours = json.loads((tmp_path / "ours" / "config.json").read_text())
    transformers.AutoConfig.from_pretrained(tmp_path / "ours").save_pretrained(tmp_path / "theirs")
    theirs = json.loads((tmp_path / "theirs" / "config.json").read_text())
    theirs.pop("transformers_version")
    # rope_theta also top-level, as transformers 4 wrote it (tools that read only it fell back to
    # 10000); transformers 5 keeps it in rope_parameters alone
    assert ours.pop("rope_theta") == ours["rope_parameters"]["rope_theta"] and "rope_theta" not in theirs
    assert ours == theirs  # same keys, same values, same (sorted) order
    assert list(ours) == sorted(ours) and ours["rope_parameters"]["rope_type"] == ("llama3" if scaling else "default")
    assert {k: ours[k] for k in SPECIALS} == SPECIALS and ours["dtype"] == dtype


def test_transformers_loads_the_export_without_warnings(tmp_path):
    cfg = our_cfg(True, SCALING)
    export_hf(randomized(cfg), cfg, str(tmp_path), specials=SPECIALS)
    handler = Captured()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    finally:
        logger.removeHandler(handler)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert handler.records == [] and [str(w.message) for w in caught] == []
    assert (model.config.bos_token_id, model.config.eos_token_id) == (1, 2)

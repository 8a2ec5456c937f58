"""Bad input fails before compute: one paragraph naming key, value and what is allowed."""

import os

import pytest

from stack.cli.app import preflight
from stack.errors import ConfigError, DataError, paragraph


def error_of(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        preflight(argv)
    msg = str(info.value)
    assert "\n" not in msg, "not one paragraph"
    return msg


def test_unknown_key_suggests_closest():
    msg = error_of(["model.d_modle=64"])
    assert "'model.d_modle'" in msg and "Did you mean d_model?" in msg


def test_unknown_key_added_with_plus_is_rejected():
    msg = error_of(["+trainer.step=5"])
    assert "'trainer.step'" in msg and "Did you mean steps?" in msg


def test_wrong_type_names_key_value_and_type():
    msg = error_of(["model.d_model=two"])
    assert "'model.d_model'" in msg and "'two'" in msg and "integer" in msg
    msg = error_of(["optimizer.lr=fast"])
    assert "'optimizer.lr'" in msg and "'fast'" in msg and "float" in msg


def test_null_for_a_key_without_null_names_what_it_takes():
    assert error_of(["trainer.steps=null"]) == "'trainer.steps' cannot be null: it takes a value of type int."
    assert "type float" in error_of(["optimizer.lr=null"])
    msg = error_of(["warm_start=null"])  # a section: its keys (warm_start.recipe=null turns it off)
    assert msg.startswith("'warm_start' cannot be null") and "(recipe, overrides, dir)" in msg


def test_a_sweep_and_a_config_print_cannot_be_combined():
    """Hydra raised a bare ValueError (a traceback) for -m with --cfg."""
    assert error_of(["-m", "seed=0,1", "--cfg", "job"]).startswith("-m (--multirun) and --cfg cannot be combined")


def test_a_sweep_without_multirun_is_one_paragraph():
    """Hydra's "Ambiguous value" message for key=a,b without -m took five lines; with -m (or
    hydra.mode=MULTIRUN) the same overrides are a sweep."""
    msg = error_of(["optimizer.lr=1e-4,3e-4", "seed=1"])
    assert msg.startswith("The override 'optimizer.lr=1e-4,3e-4' is a sweep over values of 'optimizer.lr'")
    assert "add -m" in msg and "optimizer.lr=[1e-4,3e-4]" in msg and "\"optimizer.lr='1e-4,3e-4'\"" in msg
    msg = error_of(["seed=range(0,3)"])  # a function sweep: no list or string form to suggest
    assert msg.endswith("add -m to run one job per value, or give 'seed' one value.")
    assert preflight(["-m", "seed=0,1"]).seed == 0
    assert preflight(["hydra.mode=MULTIRUN", "seed=0,1"]).seed == 0


def test_hydra_dirs_are_checked_not_made(tmp_path):
    """preflight checks that hydra.run.dir / hydra.sweep.dir can be made; making them is Hydra's, when
    a job starts (`--cfg job` left an empty directory). An existing one is left alone."""
    (tmp_path / "kept").mkdir()
    for key, path in [("hydra.run.dir", tmp_path / "a" / "b"), ("hydra.sweep.dir", tmp_path / "c"),
                      ("hydra.run.dir", tmp_path / "kept")]:
        assert preflight([f"{key}={path}", "--cfg", "job"]) is not None
    assert sorted(os.listdir(tmp_path)) == ["kept"]
    assert error_of(["hydra.run.dir=/proc/nope/run"]).startswith("'hydra.run.dir'='/proc/nope/run' cannot be created")


def test_unknown_group_option_lists_options():
    msg = error_of(["model=llama_huge"])
    assert "'llama_huge'" in msg and "llama_tiny" in msg and "llama3_8b" in msg


def test_unknown_recipe_lists_recipes():
    msg = error_of(["+recipe=llama_nope"])
    assert "'llama_nope'" in msg and "llama_sft" in msg


def test_bad_choice_and_bad_model_shape():
    assert "train" in error_of(["mode=trian"])
    msg = error_of(["model.n_kv_heads=3"])
    assert "n_kv_heads" in msg and "3" in msg and "n_heads" in msg


def test_heads_rope_and_context_that_cannot_run_are_refused():
    assert error_of(["model.head_dim=7"]).startswith("The head size 'model.head_dim'=7 must be even")
    assert "d_model/n_heads (64/64)=1" in error_of(["model.n_heads=64", "model.n_kv_heads=64"])
    assert error_of(["model.rope_theta=0"]).startswith("'model.rope_theta'=0.0 must be > 0")
    msg = error_of(["model.max_seq_len=8", "data.seq_len=16"])
    assert "'data.seq_len'=16 exceeds 'model.max_seq_len'=8" in msg
    assert "'data.max_operand'=1 must be >= 2" in error_of(["data.max_operand=1"])


def test_sweep_values_are_checked():
    msg = error_of(["-m", "model.d_model=64,sixty", "seed=0,1"])
    assert "'model.d_model'" in msg and "'sixty'" in msg
    assert "'nope'" in error_of(["-m", "+recipe=llama_sft,nope"])


def test_untrusted_target_needs_opt_in():
    msg = error_of(["algorithm._target_=os.system"])
    assert "'algorithm._target_'" in msg and "allow_targets" in msg
    msg = error_of(["algorithm._target_=tests.unit.toy_reinforce.Reinforce"])
    assert "outside the allowed packages" in msg and "is not imported" in msg
    # explicit opt-in passes the pre-run check (build then judges the object it names)
    preflight(["algorithm._target_=tests.unit.toy_reinforce.Reinforce", "allow_targets=[tests]"])


def test_unknown_key_in_a_chain_entry_lists_its_keys():
    msg = error_of(["optimizer.chain.1.bb1=0.8"])
    assert "'optimizer.chain[1].bb1'" in msg and "Did you mean b1?" in msg


def test_data_config_mistakes_fail_before_compute():
    assert "'data.packing'=true works for data.kind text and sft, not 'preference'" in error_of(
        ["algorithm=dpo", "data=jsonl_prefs", "data.packing=true"])
    assert "'data.max_bad_fraction'=1.5 must be in [0, 1)" in error_of(["data.max_bad_fraction=1.5"])
    assert "'data.train_on_input'=true (loss on the prompt too) applies to data.kind=sft, not 'preference'" in \
        error_of(["algorithm=dpo", "data=jsonl_prefs", "data.train_on_input=true"])
    preflight(["data=jsonl_sft", "data.train_on_input=true"])
    assert "'data.eval_fraction'=0.0 must be in (0, 1): every run evaluates (the eval curves and a sweep's " \
        "objective); to train on every record of data.path, give the held-out records as data.eval_path." in error_of(
            ["data=jsonl_sft", "data.path=a.jsonl", "data.eval_fraction=0"])
    preflight(["data=jsonl_sft", "data.path=a.jsonl", "data.eval_path=b.jsonl", "data.eval_fraction=0"])  # unused
    assert "Unknown value 'chatm' for 'data.chat_template'. Did you mean chatml?" in error_of(
        ["data.chat_template=chatm"])
    assert "'data.path' is required for data.source='parquet'" in error_of(["data.source=parquet"])
    assert "'data.max_completion_len'=64: expected null or an integer in [1, data.seq_len=64)" in error_of(
        ["algorithm=dpo", "data=jsonl_prefs", "data.max_completion_len=64"])
    assert "'data.max_completion_len'=8 applies to data.kind=preference, not 'sft'" in error_of(
        ["data.max_completion_len=8"])
    assert "'data.share_prompt'=true needs data.max_completion_len" in error_of(
        ["algorithm=dpo", "data=jsonl_prefs", "data.share_prompt=true"])
    assert "'data.share_prompt'=true lays pairs out for algorithm=dpo; algorithm='rm' reads separate" in error_of(
        ["algorithm=rm", "data=jsonl_prefs", "data.share_prompt=true", "data.max_completion_len=8"])


@pytest.mark.parametrize("argv, words", [
    # zeroed every update
    (["optimizer.clip_norm=0"], ["'optimizer.clip_norm'=0.0 must be > 0", "clip_norm=inf clips nothing"]),
    (["optimizer.clip_norm=-1"], ["'optimizer.clip_norm'=-1.0 must be > 0"]),  # flipped every gradient
    (["optimizer.lr=-1e-3"], ["'optimizer.lr'=-0.001 must be >= 0"]),  # gradient ascent
    (["optimizer.weight_decay=-0.1"], ["'optimizer.weight_decay'=-0.1 must be >= 0"]),
    (["optimizer.warmup_steps=-3"], ["'optimizer.warmup_steps'=-3 must be >= 0"]),
    (["optimizer.extra.b2=1.5"], ["'optimizer.extra.b2'=1.5 must be in [0, 1)"]),
    (["optimizer=sgd", "optimizer.extra.momentum=1"], ["'optimizer.extra.momentum'=1 must be in [0, 1)"]),
    (["optimizer.extra.eps=0"], ["'optimizer.extra.eps'=0 must be > 0"]),
    (["trainer.eval_every=-5"], ["'trainer.eval_every'=-5 must be >= 0"]),
])
def test_optimizer_and_cadence_values_that_trained_silently_wrong_are_refused(argv, words):
    msg = error_of(argv)
    assert all(w in msg for w in words), msg


@pytest.mark.parametrize("argv", [["algorithm.top_p=0"], ["algorithm.top_p=1.5"], ["algorithm.top_k=-1"]])
def test_grpo_sampling_filters_out_of_range_are_refused(argv):
    msg = error_of(["algorithm=grpo", "data=jsonl_prompts", *argv])
    assert "top_k must be >= 0 (0: off) and top_p in (0, 1]" in msg and argv[0].split("=")[1] in msg, msg


@pytest.mark.parametrize("argv,words", [
    (["algorithm.importance_sampling_level=sequense"],
     ["'algorithm.importance_sampling_level'", "Did you mean sequence?"]),
    (["algorithm.delta=0.9"], ["'algorithm.delta'=0.9 caps the importance ratio: null (off) or > 1"]),
    (["algorithm.top_entropy_quantile=0"], ["'algorithm.top_entropy_quantile'=0.0: null or in (0, 1]"]),
])
def test_grpo_loss_options_out_of_range_are_refused(argv, words):
    msg = error_of(["algorithm=grpo", "data=jsonl_prompts", *argv])
    assert all(w in msg for w in words), msg


def test_the_algorithm_says_which_data_it_reads():
    msg = error_of(["data=jsonl_prefs"])
    assert "'data.kind'='preference' does not fit algorithm='sft', which reads sft or text records" in msg
    assert "'algorithm.loss_type'" in error_of(["algorithm=dpo", "data=jsonl_prefs", "algorithm.loss_type=ipx"])
    # a DPO recipe on SFT data: the mismatch, not the recipe's preference-only key it trips first
    assert error_of(["+recipe=llama_dpo", "data=jsonl_sft"]).startswith(
        "'data.kind'='sft' does not fit algorithm='dpo'")
    assert "pick a data option of that kind (data=jsonl_prompts)" in error_of(["algorithm=grpo"])  # the options named
    assert "(data=jsonl_sft, data=parquet_sft, data=synthetic)" in msg


def test_a_recipe_without_its_plus_says_to_add_one():
    """Hydra's hint (its second line) was dropped: 'Cannot compose ...: Could not override 'recipe'.'"""
    assert error_of(["recipe=llama_sft"]) == ("recipe=llama_sft: 'recipe' is not a group of the default config, so it "
                                              "cannot be overridden; add it with a plus: +recipe=llama_sft.")


@pytest.mark.parametrize("argv, words", [
    (["trainer.steps=[1,2"], ["Cannot parse the override 'trainer.steps=[1,2'", "key=value"]),
    (["run_dir=é"], ["Cannot parse the override 'run_dir=é'", "quote"]),
    (["~trainer.steps"], ["~trainer.steps"]),
    (["optimizer.chain.k0.max_norm=1"], ["optimizer.chain.k0.max_norm=1", "'k0'"]),
    (["trainer.steps=${oc.env:HOME}"], ["'trainer.steps'", "oc.env:HOME", "integer"]),
])
def test_inputs_that_were_tracebacks_are_one_paragraph(argv, words):
    """Hardening (issue 15, item 8): each was an IndexError / parse or type traceback."""
    msg = error_of(argv)
    assert all(w in msg for w in words), msg


def test_a_3000_character_key_or_value_is_shortened_in_the_message():
    for argv in (["x" * 3000 + "=1"], ["model.d_model=" + "y" * 3000], ["model=" + "z" * 3000]):
        msg = error_of(argv)
        assert len(msg) < 800 and "(3" in msg and "characters)" in msg, msg


def test_a_100_kb_value_echoed_by_any_check_is_shortened_on_the_console():
    """Checks that quote the value itself (a tokenizer path, a run dir) go through `paragraph`, the
    one printer of every entry point: each long word cut in the middle."""
    long = "x" * 100_000
    for exc in (ConfigError(f"'data.tokenizer'={long!r}: no such file."), DataError(f"{long}:3: not JSON")):
        msg = paragraph(exc)
        assert msg.startswith("error: ") and len(msg) < 300 and " characters)..." in msg, msg[:400]
    assert paragraph(ConfigError("a /short/path stays")) == "error: a /short/path stays"


@pytest.mark.parametrize("value", ["fsdpp", "[data,fsdpp]"])
def test_a_rule_naming_no_mesh_axis_is_refused_before_the_mesh_is_made(value):
    """It was a KeyError traceback from the mesh."""
    assert "'mesh.rules.batch' names 'fsdpp', which is not a mesh axis" in error_of([f"mesh.rules.batch={value}"])


def test_the_last_of_a_key_given_twice_wins():
    """Hydra's rule, also when the earlier value is bad (it was reported instead)."""
    from stack.cli.app import last_wins

    assert preflight(["trainer.steps=3", "trainer.steps=5"]).trainer.steps == 5
    assert preflight(["model.d_model=two", "model.d_model=64"]).model.d_model == 64
    assert preflight(["model=llama3_8b", "+recipe=llama_sft", "model=llama_tiny"]).model.name == "llama_tiny"
    assert last_wins(["-m", "a=1", "+b=2", "~c", "a=3", "--cfg", "job"]) == ["-m", "+b=2", "~c", "a=3", "--cfg", "job"]


def test_an_empty_value_is_refused_before_it_reaches_a_function():
    msg = error_of(["optimizer.schedule.end_ratio="])  # was a TypeError deep inside the schedule
    assert "'optimizer.schedule.end_ratio' no value" in msg and "optimizer.schedule.end_ratio=''" in msg
    assert preflight(["logger.project=''"]).logger.project == ""  # an empty string on purpose


def test_an_eval_split_smaller_than_a_batch_says_where_its_records_come_from(tmp_path):
    """Your own data.path of 40 records: its 0.1 eval split (4 records) fills no batch of 8."""
    import json

    from stack.run.build import build

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(40)))
    for extra, where in [([], f"a seeded data.eval_fraction=0.1 of data.path='{path}') holds 4 records"),
                         ([f"data.eval_path={path}", "data.batch_size=64"], f"data.eval_path='{path}') holds 40")]:
        cfg = preflight(["data=jsonl_sft", f"data.path={path}", "data.batch_size=8", *extra])
        with pytest.raises(ConfigError) as info:
            build(cfg, str(tmp_path), abstract=True)
        assert where in str(info.value) and "fills no batch of data.batch_size=" in str(info.value), info.value


def test_a_malformed_line_of_a_small_file_is_named_not_the_split_size(tmp_path):
    """12 lines, the 6th cut short: the eval split (1 record) fills no batch, but the bad line is the
    problem to fix, so it is what the error names."""
    import json

    from stack.run.build import build

    good = [json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) for i in range(11)]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(good[:5] + ['{"prompt": "1+1=", "completion": '] + good[5:]) + "\n")
    with pytest.raises(DataError, match=f"{path}:6: not valid JSON"):
        build(preflight(["data=jsonl_sft", f"data.path={path}"]), str(tmp_path), abstract=True)


def test_a_data_path_the_synthetic_source_would_ignore_is_refused():
    assert "data.source=synthetic generates its records and reads no file" in error_of(["data.path=/data/sft.jsonl"])


def test_a_run_dir_without_checkpoints_says_what_became_of_them(tmp_path):
    """Where a checkpoints dir is asked for (generate, model.init_from, checkpoint.resume), a run
    dir stands for RUN/checkpoints; one without it is refused, saying what its config.yaml says."""
    from stack.checkpoint.saved_params import checkpoints_of

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("checkpoint:\n  name: none\n  path: null\n")
    with pytest.raises(ConfigError, match=r"'.*/run' is a stack run's dir .* saved none \(it ran with checkpoint=none"):
        checkpoints_of(str(run))
    (run / "config.yaml").write_text("checkpoint:\n  name: local\n  path: /elsewhere\n")
    with pytest.raises(ConfigError, match="wrote them to checkpoint.path='/elsewhere'"):
        checkpoints_of(str(run))
    (run / "checkpoints").mkdir()
    assert checkpoints_of(str(run)) == str(run / "checkpoints")
    assert checkpoints_of(str(tmp_path)) == str(tmp_path)  # not a run dir: as given

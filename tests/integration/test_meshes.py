"""8 fake CPU devices: every mesh gives the single-device losses; shards have the right shapes."""

import json
import os
import socket
import subprocess
import sys

import pytest

from stack.hardware.platform import PROBE_VERSION
from tests.helpers import REPO, fake_devices

MESHES = ["mesh=single", "mesh=dp", "mesh=fsdp", "mesh=fsdp_tp", "mesh=fsdp_tp mesh.data=2 mesh.tensor=2"]


PEAK = 8e10  # the host's measured CPU peak, FLOP/s (pinned in the worker's cache root)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    with open(root / f"cpu_peak-{socket.gethostname()}.json", "w") as f:
        json.dump({"flops_per_sec": PEAK, "busy": False, "version": PROBE_VERSION}, f)
    env = {**fake_devices(8), "STACK_CACHE_DIR": str(root)}
    out = subprocess.run([sys.executable, "-m", "tests.integration.mesh_worker", *MESHES], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_mesh_matches_single_device_losses(result):
    assert result["devices"] == 8
    single = result["losses"]["mesh=single"]
    assert len(single) == 5 and single[-1] < single[0]
    for mesh in MESHES[1:]:
        assert result["losses"][mesh] == pytest.approx(single, abs=1e-5), mesh


def test_mfu_divides_the_host_peak_among_the_meshs_devices_only(result):
    """The 8 fake devices share the host's cores; a mesh of one of them has all of them, so its
    peak is the host's (it was PEAK / 8: MFU 8x too high, 193 % for a tiny SFT run)."""
    assert result["peaks"]["mesh=single"] == PEAK
    assert all(result["peaks"][m] == PEAK / 8 for m in MESHES[1:]), result["peaks"]


def test_a_checkpoint_written_on_8_devices_reads_back_on_one(result):
    """`read_params` (model.init_from, a reference or reward model from a checkpoint, export,
    generate) reads host arrays whatever mesh wrote them; restoring with the saved shardings
    failed on another device count (Orbax: "devices are different from the devices used to save")."""
    import jax
    import numpy as np

    from stack.checkpoint.saved_params import read_params

    assert jax.device_count() != result["devices"]
    saved = read_params(os.path.join(result["saved"], "checkpoints"))
    leaves = jax.tree_util.tree_flatten_with_path(saved.tree["policy"])[0]
    got = {"/".join(str(k.key) for k in path): leaf for path, leaf in leaves}
    want = np.load(os.path.join(result["saved"], "params.npz"))
    assert saved.step == 5 and sorted(got) == sorted(want.files)
    assert all(isinstance(got[k], np.ndarray) and np.array_equal(got[k], want[k]) for k in want.files)


def test_shard_shapes(result):
    # llama_tiny: d_model 64, n_heads 4 x head_dim 16 = 64, d_ff 176, vocab 384
    q, emb, down = "layers/0/attn/q_proj/kernel", "embed/embedding", "layers/0/mlp/down_proj/kernel"
    single, dp, fsdp, tp = (result["shards"][m] for m in ("mesh=single", "mesh=dp", "mesh=fsdp", "mesh=fsdp_tp"))
    assert single[q] == {"global": [64, 64], "shards": [[64, 64]], "devices": 1}
    assert dp[q]["shards"] == [[64, 64]] and dp[q]["devices"] == 8  # replicated
    assert fsdp[q]["shards"] == [[8, 64]]  # embed over fsdp=8
    assert fsdp[emb]["shards"] == [[384, 8]]  # (vocab, embed): embed over fsdp
    assert tp[q]["shards"] == [[16, 32]]  # embed over fsdp=4, heads over tensor=2
    assert tp[down]["shards"] == [[88, 16]]  # (mlp, embed): 176/2, 64/4
    assert tp[emb]["shards"] == [[192, 16]]  # (vocab, embed): 384/2, 64/4
    # Adam's moments are laid out like their params (not replicated)
    assert fsdp["adam_mu/q_proj"]["shards"] == [[8, 64]] and tp["adam_mu/q_proj"]["shards"] == [[16, 32]]


@pytest.mark.parametrize("argv,words", [
    (["mesh=fsdp_tp", "mesh.tensor=8"], ["n_heads=4", "size 8"]),
    (["mesh=dp", "mesh.data=2", "mesh.fsdp=-1", "data.batch_size=6"], ["batch_size=6"]),
])
def test_impossible_meshes_fail_before_compile(argv, words, tmp_path):
    code = ("import sys; from stack.cli.app import preflight; from stack.run.build import build; "
            "from tests.helpers import make_cfg; "
            f"build(make_cfg({argv!r} + ['run_dir={tmp_path}']), '{tmp_path}')")
    env = fake_devices(8)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "ConfigError" in out.stderr
    for word in words:
        assert word in out.stderr, out.stderr[-500:]


def test_mesh_sizes_that_cannot_fill_the_devices(tmp_path):
    code = ("from stack.run.build import build; from tests.helpers import make_cfg; "
            f"build(make_cfg(['mesh=fsdp_tp', 'mesh.tensor=3', 'model.n_heads=6', 'model.n_kv_heads=3', "
            f"'model.d_model=96']), '{tmp_path}')")
    env = fake_devices(8)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "multiply to 3" in out.stderr and "8 devices" in out.stderr


DPO = "algorithm=dpo data=jsonl_prefs data.batch_size=8"
DPO_MESHES = {"all-axes": ["mesh=single", "mesh=fsdp_tp mesh.data=2 mesh.tensor=2"],  # data x fsdp x tensor at once
              "dp-fsdp": ["mesh=single", "mesh=dp", "mesh=fsdp"]}


@pytest.mark.parametrize("meshes", ["all-axes", pytest.param("dp-fsdp", marks=pytest.mark.slow)])  # CI's slow tier
def test_dpo_under_every_mesh_matches_single_device(meshes):
    runs = [f"{DPO} {m}" for m in DPO_MESHES[meshes]]
    out = subprocess.run([sys.executable, "-m", "tests.integration.mesh_worker", *runs], cwd=REPO,
                         env=fake_devices(8), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = json.loads(out.stdout.strip().splitlines()[-1])["losses"]
    single = losses[runs[0]]
    assert single[0] == pytest.approx(0.6931471824645996, abs=1e-6)  # policy == reference at step 1
    for run in runs[1:]:
        assert losses[run] == pytest.approx(single, abs=1e-5), run


ADAPTED = [f"algorithm=dpo data=jsonl_prefs data.batch_size=8 optimizer.lr=1e-2 {q} {m}"
           for q in ("quantization=lora", "quantization=qlora_nf4 quantization.rules.0.tile_size=16")
           for m in ("mesh=single", "mesh=fsdp_tp mesh.data=2 mesh.tensor=2")]
PRECOMPUTED = [f"algorithm=dpo data=jsonl_prefs data.batch_size=8 algorithm.precompute_reference=true {m}"
               for m in ("mesh=single", "mesh=fsdp_tp mesh.data=2 mesh.tensor=2")]


@pytest.mark.slow  # main tier: a faster sibling covers it; CI runs the slow tier
def test_lora_qlora_and_precomputed_dpo_under_meshes_match_single_device():
    env = fake_devices(8)
    out = subprocess.run([sys.executable, "-m", "tests.integration.mesh_worker", *ADAPTED, *PRECOMPUTED], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = json.loads(out.stdout.strip().splitlines()[-1])["losses"]
    for group in (ADAPTED[:2], ADAPTED[2:], PRECOMPUTED):
        single = losses[group[0]]
        assert single[0] == pytest.approx(0.6931471824645996, abs=1e-6)  # the reference is the initial policy
        assert single[-1] < single[0] - 1e-3  # and the policy moves
        for mesh in group[1:]:
            assert losses[mesh] == pytest.approx(single, abs=1e-5), mesh


@pytest.mark.parametrize("overrides", [["mesh=fsdp_tp", "mesh.tensor=2"],
                                       ["+recipe=llama_dpo", "mesh=fsdp", "trainer.grad_accum=2"]],
                         ids=["sft-fsdp_tp", "dpo-fsdp-accum"])
def test_mode_compile_lowers_the_train_step_that_training_runs(overrides):
    """One function makes the step for both paths: the StableHLO texts are equal, line for line."""
    out = subprocess.run([sys.executable, "-m", "tests.integration.hlo_worker", *overrides], cwd=REPO,
                         env=fake_devices(8), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["devices"] == 8 and result["lines"] > 100
    assert result["equal"], result["diff"]


GRPO_MESHES = [f"algorithm=grpo data=jsonl_prompts algorithm.num_generations=2 algorithm.max_new_tokens=4 {q} {m}"
               for q in ("", "quantization=lora optimizer.lr=1e-2")
               for m in ("mesh=single", "mesh=fsdp_tp mesh.data=2 mesh.tensor=2")]


@pytest.mark.slow  # main tier: a faster sibling covers it; CI runs the slow tier
def test_grpo_generation_and_training_under_meshes_and_lora_match_single_device():
    """The KV cache is laid out by the same logical rules as the activations; sampling keys do
    not depend on the mesh, so every mesh draws the same completions and gets the same losses."""
    out = subprocess.run([sys.executable, "-m", "tests.integration.mesh_worker", *GRPO_MESHES], cwd=REPO,
                         env=fake_devices(8), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = json.loads(out.stdout.strip().splitlines()[-1])["losses"]
    for single, sharded in (GRPO_MESHES[:2], GRPO_MESHES[2:]):
        assert len(losses[single]) == 5
        assert losses[sharded] == pytest.approx(losses[single], abs=1e-5), sharded


def test_the_cpu_peak_probe_runs_under_a_mesh_of_several_devices(tmp_path):
    """The trainer asks for the peak inside its mesh (stack.engine.trainer.metrics.PeakProbe): the probe's
    one-device matmul failed there with 'Received incompatible devices for jitted computation'."""
    probe = ("import jax; from jax.sharding import AxisType; from stack.hardware.platform import measure_cpu_peak\n"
             "mesh = jax.make_mesh((4,), ('data',), axis_types=(AxisType.Auto,))\n"
             "with jax.set_mesh(mesh):\n    print(measure_cpu_peak(None))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=fake_devices(4), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.strip().splitlines()[-1]) > 1e8


SPLASH = ["mesh=single data.seq_len=128", *(f"{m} data.seq_len=128 model.attention=splash" for m in
          ("mesh=single", "mesh=fsdp_tp", "mesh=fsdp_tp mesh.data=2 mesh.tensor=2"))]


def test_the_splash_kernel_under_meshes_matches_the_core_on_one_device():
    """model.attention=splash (Pallas interpret mode on CPU): per shard of rows and heads (shard_map),
    as the TPU runs it; the losses of 5 steps within 1e-5 of the core's on one device."""
    out = subprocess.run([sys.executable, "-m", "tests.integration.mesh_worker", *SPLASH], cwd=REPO,
                         env=fake_devices(8), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = json.loads(out.stdout.strip().splitlines()[-1])["losses"]
    core = losses[SPLASH[0]]
    assert len(core) == 5 and core[-1] < core[0]
    for run in SPLASH[1:]:
        assert losses[run] == pytest.approx(core, abs=1e-5), run


CONTEXT = ["mesh=single", "mesh=context mesh.context=4",
           "mesh=context mesh.context=2 mesh.tensor=2 model.attention=splash"]


def test_context_parallel_runs_match_one_device():
    """mesh=context: each packed 256-token row split over 4 devices (the core, XLA's partitioner
    gathering keys and values) or 2 (splash per query shard, heads over tensor); the losses of 5
    steps within 1e-5 of one device's, and params sharded over fsdp x context."""
    runs = [f"{m} data.seq_len=256 data.packing=true" for m in CONTEXT]
    out = subprocess.run([sys.executable, "-m", "tests.integration.mesh_worker", *runs], cwd=REPO,
                         env=fake_devices(8), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    one = result["losses"][runs[0]]
    assert len(one) == 5 and one[-1] < one[0]
    for run in runs[1:]:
        assert result["losses"][run] == pytest.approx(one, abs=1e-5), run
    assert result["shards"][runs[1]]["layers/0/attn/q_proj/kernel"]["shards"] == [[8, 64]]  # embed over 2 x 4

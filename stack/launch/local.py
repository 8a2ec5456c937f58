"""`launcher=local`: N JAX processes of the same command on this machine, over loopback.

The launcher picks a free coordinator port and a run dir, then starts `python -m stack ARGS
launcher=none` N times with STACK_COORDINATOR / STACK_NUM_PROCESSES / STACK_PROCESS_ID set;
each process calls `jax.distributed.initialize` from them (`init_distributed`, stack.run.modes)
before any computation, so the mesh spans every process's devices. Rank 0 writes to this
console (without Gloo's connection line: stack.launch.relay), rank i to `<run_dir>/rank<i>.log`.
When a rank fails, the others are stopped (SIGTERM, then SIGKILL after `launcher.grace_seconds`);
the exit code is the failing rank's. Ctrl-C or SIGTERM to the launcher goes on to every rank (they
save, as on a preemption, and the launcher waits for them), and a rank whose launcher dies, even by
SIGKILL, gets SIGTERM from the kernel (Linux): no rank outlives it.
"""

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from stack.checkpoint.rundir import unclaimed
from stack.errors import ConfigError
from stack.launch.cloud import cloud_command, launch_cloud
from stack.launch.hydra_job import sets_job_dir
from stack.launch.relay import relay
from stack.launch.slurm import export_ranks

ENV = ("STACK_COORDINATOR", "STACK_NUM_PROCESSES", "STACK_PROCESS_ID")


def init_distributed() -> None:
    """`jax.distributed.initialize` from the launcher's environment (a no-op without it):
    STACK_DISTRIBUTED=auto (tpu_pod, xpk) lets jax find the cluster; launcher=local sets STACK_*,
    and so does a submitit task (hydra/launcher=slurm, stack.launch.slurm)."""
    if os.environ.get("STACK_DISTRIBUTED") == "auto":
        import jax  # off the CLI's light path: only a rank of several imports it here

        jax.distributed.initialize()
        return
    export_ranks()  # a submitit (SLURM) job of several tasks
    if not os.environ.get("STACK_COORDINATOR"):
        return
    import jax  # as above

    jax.distributed.initialize(os.environ["STACK_COORDINATOR"], num_processes=int(os.environ["STACK_NUM_PROCESSES"]),
                               process_id=int(os.environ["STACK_PROCESS_ID"]))


def one_of_several() -> bool:
    """Whether this process is one rank of a job of several processes (any launcher)."""
    return os.environ.get("STACK_DISTRIBUTED") == "auto" or int(os.environ.get("STACK_NUM_PROCESSES", "1")) > 1


def end_failed_rank(code: int) -> None:
    """Exit now with `code`, skipping the interpreter's teardown: there, `jax.distributed`'s
    shutdown waits at a barrier for every rank, and the others may be waiting on this one (a
    collective, an Orbax save), so a failed rank would never exit and its launcher (launcher=local,
    srun) never learn that it failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_command(argv: list[str], run_dir: str) -> list[str]:
    """The command every rank runs: the user's arguments (less any `hydra.run.dir`), one run dir, no
    launcher. Hydra's job dir is then the run dir, as `run_dir=` alone makes it
    (stack.launch.hydra_job.into_run_dir: no `.hydra/`, no app.log)."""
    return [sys.executable, "-m", "stack", *[a for a in argv if not sets_job_dir(a)], f"run_dir={run_dir}",
            "launcher=none"]


def start(launcher: Any, argv: list[str], run_dir: str) -> tuple[list[subprocess.Popen], subprocess.Popen]:
    """The N rank processes (rank 0 on this console through `relay`, the others into rank<i>.log)
    and the process relaying rank 0's output."""
    port = launcher.port or free_port()
    os.makedirs(run_dir, exist_ok=True)
    procs, (console, relaying) = [], relay(sys.stdout.fileno())
    for rank in range(launcher.num_processes):
        env = {**os.environ, "STACK_COORDINATOR": f"127.0.0.1:{port}",
               "STACK_NUM_PROCESSES": str(launcher.num_processes), "STACK_PROCESS_ID": str(rank)}
        out = console if rank == 0 else open(os.path.join(run_dir, f"rank{rank}.log"), "w")
        procs.append(subprocess.Popen(rank_command(argv, run_dir), env=env, stdout=out,
                                      stderr=None if rank == 0 else subprocess.STDOUT,
                                      preexec_fn=partial(die_with, os.getpid())))
    os.close(console)  # rank 0 holds it now: the relay ends when rank 0 (and what it started) does
    return procs, relaying


def die_with(launcher_pid: int) -> None:
    """In a rank, before exec: SIGTERM when the launcher dies (Linux `prctl(PR_SET_PDEATHSIG)`),
    also when it dies before this call."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != launcher_pid:
            os.kill(os.getpid(), signal.SIGTERM)


def forward(procs: list[subprocess.Popen], signum: int) -> None:
    """Send `signum` to every live rank."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)


def wait_all(procs: list[subprocess.Popen], grace: float) -> int:
    """Wait for every rank; once one fails, stop the rest. The job's exit code: the first failing
    rank's (the others were stopped because of it), else the worst one (0 if all ok)."""
    while None in (codes := [p.poll() for p in procs]):  # poll every rank (`any` would stop at the first)
        if failed := [c for c in codes if c not in (None, 0)]:
            stop(procs, grace)
            return shell_code(failed[0])
        time.sleep(0.2)
    return shell_code(max(codes, key=lambda c: (c != 0, abs(c))))


def shell_code(code: int) -> int:
    """A Popen return code as a shell reports it: a rank killed by signal N exits 128 + N."""
    return 128 - code if code < 0 else code


def stop(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM the live ranks, SIGKILL those still alive after `grace` seconds."""
    forward(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def launch_local(launcher: Any, argv: list[str], run_dir: str) -> int:
    """Run the N ranks to the end; Ctrl-C and SIGTERM go on to them (they stop at the same round,
    save and exit: stack.engine.trainer.signals). The exit code of the job."""
    sys.stdout.flush()
    procs, relaying = start(launcher, argv, run_dir)
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda signum, _: forward(procs, signum)) for sig in signals}
    try:
        code = wait_all(procs, launcher.grace_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            relaying.wait(timeout=5)  # the rest of rank 0's output
        except subprocess.TimeoutExpired:  # something rank 0 started still holds its output
            relaying.kill()
    print(f"launcher=local: {len(procs)} processes exited with {[p.returncode for p in procs]} ({run_dir})",
          file=sys.stderr)
    return code


def launcher_for(cfg: Any, argv: list[str]) -> Callable[[], int] | None:
    """What runs the job `argv` (a zero-argument call returning its exit code), or None when
    this process runs it (launcher=none). Raises ConfigError for a launcher that cannot start."""
    launcher = cfg.launcher
    if launcher.name == "none":
        return None
    if launcher.name in ("tpu_pod", "xpk"):
        cloud_command(launcher, argv)  # its ConfigError now, before anything starts
        return partial(launch_cloud, launcher, argv)
    if "-m" in argv or "--multirun" in argv:
        raise ConfigError("'launcher'='local' runs one job on several processes, not a sweep (-m): "
                          "run each job of the sweep with its own command, or drop launcher= for a sweep.")
    return lambda: launch_local(launcher, argv, job_dir(cfg.run_dir, argv))


def job_dir(run_dir: str | None, argv: list[str]) -> str:
    """The run dir of a launched job: `run_dir`, else the last `hydra.run.dir=` of `argv` (its
    `${now:FORMAT}` resolved as Hydra resolves it), else Hydra's default outputs/DATE/TIME, claimed
    (a `-N` added when another run took it: stack.checkpoint.rundir.unclaimed)."""
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("hydra.run.dir=")]
    path = run_dir or (given[-1] if given else "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}")
    path = re.sub(r"\$\{now:([^}]*)\}", lambda m: time.strftime(m.group(1)), path)
    return path if run_dir or given else unclaimed(path, "hydra.run.dir")

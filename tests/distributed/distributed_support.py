"""Runs real torchrun jobs for the distributed tests: free ports, a scrubbed environment, bounded waits.

Every job is bounded in time and leaves no process behind: torchrun's agent runs in its own
session (killed as a group), and each worker records its pid so a stuck one is killed by id.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "torchrun_worker.py"

#: Variables of the developer's shell (or of an enclosing launch) that would change what a job sees.
SCRUBBED_ENV_PREFIXES = ("TORCHELASTIC_", "NEURON_", "TPU_", "PJRT_", "CLOUD_TPU_", "GPU_", "XLA_")
SCRUBBED_ENV_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "CPU_NUM_DEVICES",
    "NEURONCORE_NUM_DEVICES",
)
#: Seconds a worker may live before it dumps its stack and exits on its own (faulthandler).
WORKER_WATCHDOG_S = 60
#: Seconds a whole job may take before the test kills it.
JOB_TIMEOUT_S = 90


def is_scrubbed(name: str) -> bool:
    return name in SCRUBBED_ENV_VARS or name.startswith(SCRUBBED_ENV_PREFIXES)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without rank, launcher or device variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not is_scrubbed(k)}
    env.update(
        PYTHONUNBUFFERED="1",
        PJRT_TEST_WORKER_WATCHDOG_S=str(WORKER_WATCHDOG_S),
        GLOO_SOCKET_IFNAME="lo",  # gloo on loopback, whatever the host name resolves to
    )
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class JobResult:
    returncodes: list[int]
    logs: str
    results: dict[int, dict] = field(default_factory=dict)  # global rank -> what that worker wrote

    def describe(self) -> str:
        errors = "\n".join(f"--- rank {r} error:\n{res['error']}" for r, res in self.results.items() if "error" in res)
        return f"return codes {self.returncodes}\n{errors}\n--- logs:\n{self.logs[-6000:]}"


def _kill_workers(out_dir: Path) -> None:
    """SIGKILL every worker of this job still alive, by the pid it recorded (checked against its command line)."""
    for pid_file in out_dir.glob("pid.*"):
        pid = int(pid_file.name.rsplit(".", 1)[1])
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # already gone
        if WORKER.name.encode() in cmdline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def run_job(
    scenario: str,
    out_dir: Path,
    *,
    nproc: int = 2,
    nnodes: int = 1,
    env: dict[str, str] | None = None,
    timeout: float = JOB_TIMEOUT_S,
) -> JobResult:
    """Run ``torchrun_worker.py <scenario>`` under ``nnodes`` torchrun agents on 127.0.0.1 and collect the results.

    Several nodes are several ``torchrun --nnodes N --node-rank K`` agents sharing one
    master port: what two hosts would run, on loopback.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    launches = []
    for node_rank in range(nnodes):
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--max-restarts", "0", "--monitor-interval", "0.1",
            str(WORKER), scenario, str(out_dir),
        ]  # fmt: skip
        launches.append((command, env or clean_env(), out_dir / f"agent{node_rank}.log"))
    return _run_bounded(
        launches, out_dir, scenario, timeout,
        late=f"torchrun job {scenario!r} did not finish within {timeout} s and was killed",
    )  # fmt: skip


def _run_bounded(
    launches: list[tuple[list[str], dict[str, str], Path]], out_dir: Path, scenario: str, timeout: float, *, late: str
) -> JobResult:
    """Start each (command, environment, log file) in its own session, wait for all until one deadline,
    kill whatever is left (groups and recorded workers), and collect the logs and results.

    Raises AssertionError starting with ``late`` (then the job's description) if the deadline passed.
    """
    procs: list[subprocess.Popen] = []
    timed_out = False
    try:
        for command, env, log_path in launches:
            with open(log_path, "wb") as log:
                procs.append(
                    subprocess.Popen(
                        command, env=env, stdout=log, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True,
                    )  # fmt: skip
                )
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for proc in procs:
            _kill_group(proc)
        _kill_workers(out_dir)
    logs = "\n".join(f"=== {p.name}\n{p.read_text(errors='replace')}" for _, _, p in launches if p.exists())
    result = JobResult([p.returncode for p in procs], logs, read_results(out_dir, scenario))
    if timed_out:
        raise AssertionError(f"{late}\n{result.describe()}")
    return result


def read_results(out_dir: Path, scenario: str) -> dict[int | str, dict]:
    """What each worker wrote, by global rank (or by its PJRT_TEST_LABEL when the test gave one)."""
    results: dict[int | str, dict] = {}
    for path in sorted(out_dir.glob(f"{scenario}.*.json")):
        data = json.loads(path.read_text())
        results[data["label"] if data.get("label") else int(data["rank"])] = data
    return results


def run_plain(
    scenario: str, out_dir: Path, *, envs: list[dict[str, str]], timeout: float = JOB_TIMEOUT_S
) -> JobResult:
    """Run one worker per environment in ``envs`` without torchrun (as another launcher, or none, would)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    launches = [
        ([sys.executable, str(WORKER), scenario, str(out_dir)], env, out_dir / f"plain{i}.log") for i, env in enumerate(envs)
    ]
    return _run_bounded(
        launches, out_dir, scenario, timeout,
        late=f"workers of {scenario!r} did not finish within {timeout} s and were killed",
    )  # fmt: skip

"""A job that is not what its processes were told stops with an error naming the mismatch, within the bound.

Real processes (started by hand, as another launcher would, or by torchrun) on loopback,
with the real stub plugin exchanging its devices through torch's TCPStore. The bound
(``PJRT_PLUGINS_STORE_TIMEOUT``) is checked as an upper limit with a margin for a busy
machine: without the fixes these waits took 2-3 times the bound, or forever.
"""

from __future__ import annotations

import socket
import threading

import pytest
from distributed_support import clean_env, free_port, run_job, run_plain

import pjrt_plugins
from pjrt_plugins import distributed
from pjrt_plugins.errors import DistributedSetupError

#: Seconds a bounded wait may run past its bound here (thread start-up, a loaded 2-core machine).
MARGIN_S = 2.5


def by_hand(port: int, rank: int, world_size: int, **extra: str) -> dict[str, str]:
    return clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                     **extra)


@pytest.fixture
def silent_server():
    """A port held by a server that accepts connections and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    listener.close()


# -- the store -----------------------------------------------------------------------------


def test_a_store_port_held_by_a_silent_server_is_an_error_within_the_bound(tmp_path, silent_server):
    env = by_hand(silent_server, 1, 2, PJRT_PLUGINS_STORE_TIMEOUT="3")
    job = run_plain("reach_store", tmp_path, envs=[env], timeout=60)
    seen = job.results[1]
    assert seen["error_type"] == "DistributedSetupError", job.describe()
    assert "never answered as a torch.distributed store" in seen["message"] and "MASTER_PORT" in seen["message"]
    assert seen["elapsed_s"] < 3 + MARGIN_S, seen


def test_a_store_nobody_hosts_is_an_error_within_the_bound_not_after_torchs_retries(tmp_path):
    job = run_plain("reach_store", tmp_path, envs=[by_hand(free_port(), 1, 2, PJRT_PLUGINS_STORE_TIMEOUT="3")])
    assert job.returncodes == [0], job.describe()  # no abort at exit from a connect loop left behind
    seen = job.results[1]
    assert seen["error_type"] == "DistributedSetupError" and "nothing accepted a connection" in seen["message"]
    assert seen["elapsed_s"] < 3 + MARGIN_S, seen


def test_a_missing_peer_fails_within_the_bound_the_user_set(tmp_path):
    """The stub asks to wait 30 s for each peer; PJRT_PLUGINS_STORE_TIMEOUT=4 bounds the whole creation."""
    job = run_job("peer_bound", tmp_path, nproc=2, env=clean_env(PJRT_PLUGINS_STORE_TIMEOUT="4"))
    seen = job.results[0]
    assert seen["error_type"] == "PjrtError" and seen["code"] == "DEADLINE_EXCEEDED", job.describe()
    assert "what was left of the PJRT_PLUGINS_STORE_TIMEOUT bound" in seen["message"]
    assert seen["elapsed_s"] < 4 + MARGIN_S, seen


def test_the_store_hosts_death_is_a_prompt_python_error_and_the_process_goes_on(tmp_path):
    port = free_port()
    envs = [by_hand(port, rank, 2, PJRT_PLUGINS_STORE_TIMEOUT="20") for rank in (0, 1)]
    job = run_plain("host_dies", tmp_path, envs=envs)
    assert job.returncodes == [0, 0], job.describe()
    seen = job.results[1]
    assert seen["error_type"] == "DistributedSetupError", job.describe()
    assert seen["message"] == (
        f"cannot check in with the torch.distributed store at TCPStore at 127.0.0.1:{port}: it refuses connections, "
        "so the process hosting it (rank 0, or torchrun's agent on node rank 0) has exited"
    )
    assert seen["elapsed_s"] < 10, seen  # not 2 x 20 s of torch retrying to connect
    assert seen["after"] == 4


# -- who is in the job ---------------------------------------------------------------------


def test_three_processes_told_a_world_size_of_two_all_stop(tmp_path):
    """Ranks 0, 1 and 2 told WORLD_SIZE=2: rank 2 says it is outside the job and tells the job, which stops."""
    port = free_port()
    envs = [by_hand(port, 2, 2)] + [by_hand(port, rank, 2, PJRT_TEST_CREATE_DELAY_S="3") for rank in (0, 1)]
    job = run_plain("check_in", tmp_path, envs=envs)
    assert job.returncodes == [0, 0, 0], job.describe()
    assert job.results[2]["message"].startswith("rank 2 is outside the world size 2"), job.describe()
    for rank in (0, 1):
        seen = job.results[rank]
        assert seen["error_type"] == "DistributedSetupError", job.describe()
        assert "misconfigured: a process started with RANK=2 cannot take part: rank 2 is outside the world size 2" in (
            seen["message"]
        )


def test_two_processes_told_the_same_rank_all_stop(tmp_path):
    """A second RANK=1 (a process of another job on the same port, or a launch mistake) takes rank 1 first."""
    port = free_port()
    envs = [
        by_hand(port, 1, 2, PJRT_TEST_LABEL="intruder"),
        by_hand(port, 1, 2, PJRT_TEST_CREATE_DELAY_S="1"),
        by_hand(port, 0, 2, PJRT_TEST_CREATE_DELAY_S="4"),
    ]
    job = run_plain("check_in", tmp_path, envs=envs)
    assert job.returncodes == [0, 0, 0], job.describe()
    late = job.results[1]
    assert late["error_type"] == "DistributedSetupError", job.describe()
    assert late["message"].startswith(f"rank 1 of the job using the store at TCPStore at 127.0.0.1:{port} is taken twice")
    assert "another job uses the same MASTER_ADDR:MASTER_PORT" in late["message"]
    for who in (0, "intruder"):  # told by the store, at check-in or while waiting for a peer
        seen = job.results[who]
        assert seen["error_type"] == "DistributedSetupError", job.describe()
        assert "is misconfigured: rank 1 of the job" in seen["message"] and "is taken twice" in seen["message"]


def test_a_process_of_a_job_of_another_size_on_the_same_port_stops_the_job(tmp_path):
    """Rank 1 of a 3-process job joins a 2-process job's store first: the world sizes disagree."""
    port = free_port()
    envs = [
        by_hand(port, 1, 3, PJRT_TEST_LABEL="other-job", PJRT_PLUGINS_STORE_TIMEOUT="30"),
        *[by_hand(port, rank, 2, PJRT_TEST_CREATE_DELAY_S="2") for rank in (0, 1)],
    ]
    job = run_plain("check_in", tmp_path, envs=envs)
    assert job.returncodes == [0, 0, 0], job.describe()
    for rank in (0, 1):  # found at check-in, or posted by the other one a moment earlier
        assert "was told WORLD_SIZE=2, but the job using the store at TCPStore at 127.0.0.1:{} was started with " \
               "WORLD_SIZE=3".format(port) in job.results[rank]["message"], job.describe()
    other = job.results["other-job"]
    assert other["error_type"] == "DistributedSetupError" and "was told WORLD_SIZE=2" in other["message"], job.describe()


def test_a_local_world_larger_than_the_world_is_a_setup_error(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DistributedSetupError, match=r"local world size 2 .*LOCAL_WORLD_SIZE.* larger than the world size 1"):
        distributed.process_info(pjrt_plugins.get_plugin("stub_neuron"))

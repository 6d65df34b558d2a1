"""Ranks from the environment (PJRT_* over torchrun's), the store's setup errors, and import cost."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from distributed_support import clean_env, free_port

import pjrt_plugins
from pjrt_plugins import distributed
from pjrt_plugins.errors import DistributedSetupError


@pytest.fixture
def stub():
    return pjrt_plugins.get_plugin("stub_neuron")


def test_pjrt_local_process_variables_win_over_torchruns(stub, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert (stub.local_process_rank(), stub.local_world_size()) == (1, 4)
    monkeypatch.setenv("PJRT_LOCAL_PROCESS_RANK", "0")
    monkeypatch.setenv("PJRT_LOCAL_PROCESS_COUNT", "2")
    assert (stub.local_process_rank(), stub.local_world_size()) == (0, 2)


def test_host_index_is_torchruns_node_rank(stub, monkeypatch):
    assert stub.host_index() == 0
    monkeypatch.setenv("GROUP_RANK", "3")
    assert stub.host_index() == 3
    assert pjrt_plugins.get_plugin("cpu").host_index() == 3


def test_process_info_outside_any_launch_is_a_single_process(stub):
    info = distributed.process_info(stub)
    assert info == distributed.ProcessInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, host_index=0)
    assert not info.is_multiprocess


def test_process_info_reads_global_ranks_from_torchruns_variables(monkeypatch):
    torchrun = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    info = distributed.process_info("stub_neuron")
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.host_index) == (5, 8, 1, 4, 1)
    assert info.is_multiprocess


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside the world size 2"),
        ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "local rank 3 is outside the local world size 2"),
    ],
)
def test_inconsistent_ranks_are_refused(stub, monkeypatch, env, match):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DistributedSetupError, match=match):
        distributed.process_info(stub)


def test_a_malformed_rank_variable_is_named(stub, monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero'"):
        distributed.process_info(stub)


def test_default_store_without_a_launch_says_what_is_missing(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DistributedSetupError, match="MASTER_ADDR, MASTER_PORT, WORLD_SIZE not set.*torchrun"):
        distributed.default_store()


def test_several_processes_without_a_store_fail_before_any_client(stub, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistributedSetupError, match="MASTER_ADDR"):
        distributed.create_client(stub, configure=False)


def test_an_unreachable_store_is_a_bounded_setup_error(monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # as under torchrun: connect, never host
    with pytest.raises(DistributedSetupError, match=rf"cannot reach the torch.distributed store at 127.0.0.1:{port}"):
        distributed.default_store(timeout=0.5)


ABSENT_PEER = """
import time
from pjrt_plugins import distributed
from pjrt_plugins.errors import DistributedSetupError
started = time.monotonic()
try:
    distributed.create_client("stub_neuron")
except DistributedSetupError as exc:
    print(f"after {time.monotonic() - started:.1f} s: {exc}")
"""


def test_a_hand_started_rank_whose_peer_never_joins_fails_within_the_configured_bound():
    """Rank 0 started by hand (no torchrun) hosts the store and waits for its peer: 300 s by
    default, here the 2 s PJRT_PLUGINS_STORE_TIMEOUT sets, then an error saying what to do."""
    env = clean_env(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="2",
        PJRT_PLUGINS_STORE_TIMEOUT="2",
    )  # fmt: skip
    out = subprocess.run([sys.executable, "-c", ABSENT_PEER], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seconds = float(out.stdout.split()[1])
    assert seconds < 60, out.stdout
    assert "within 2 s, or not every one of the job's 2 processes joined it" in out.stdout
    assert "Check that every process was started" in out.stdout and "PJRT_PLUGINS_STORE_TIMEOUT" in out.stdout


def test_the_store_timeout_comes_from_the_argument_then_the_environment(monkeypatch, tcp_store):
    assert distributed.store_timeout() == distributed.DEFAULT_STORE_TIMEOUT_S
    monkeypatch.setenv("PJRT_PLUGINS_STORE_TIMEOUT", "12.5")
    assert distributed.store_timeout() == 12.5 and distributed.store_timeout(3) == 3.0
    assert distributed.TorchStoreKV(tcp_store).default_timeout == 12.5  # a get whose plugin gives no timeout
    for bad in ("abc", "0", "-1", "inf", "nan"):
        monkeypatch.setenv("PJRT_PLUGINS_STORE_TIMEOUT", bad)
        with pytest.raises(DistributedSetupError, match=f"PJRT_PLUGINS_STORE_TIMEOUT={bad!r} must be a finite number"):
            distributed.store_timeout()
    with pytest.raises(DistributedSetupError, match="the timeout argument must be"):
        distributed.store_timeout(0)
    # Longer than the platform can wait (timedelta and the store's own waits would overflow): the shared rule.
    monkeypatch.setenv("PJRT_PLUGINS_STORE_TIMEOUT", "1e300")
    with pytest.raises(DistributedSetupError, match=r"PJRT_PLUGINS_STORE_TIMEOUT='1e300' must be at most \d+ seconds"):
        distributed.store_timeout()


CHECK_IMPORTS = """
import json, sys
import pjrt_plugins.distributed as d
imported = "torch" in sys.modules
with d.create_client("{plugin}") as client:
    devices = len(client.devices)
print(json.dumps({{"torch_at_import": imported, "torch_after_client": "torch" in sys.modules, "devices": devices}}))
"""


@pytest.mark.parametrize("plugin", ["cpu", "stub_neuron"])
def test_single_process_clients_never_import_torch(plugin):
    out = subprocess.run(
        [sys.executable, "-c", CHECK_IMPORTS.format(plugin=plugin)],
        env=clean_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["torch_at_import"] is False
    assert seen["torch_after_client"] is False
    assert seen["devices"] >= 1

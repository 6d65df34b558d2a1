"""Real torchrun jobs on loopback: ranks, hooks, the stub's device exchange over TCPStore, and its failures.

Each job runs once per module (``python -m torch.distributed.run`` from this interpreter,
bounded in time, its processes killed on failure); the tests below read what every worker saw.
"""

from __future__ import annotations

import pytest
from distributed_support import JobResult, clean_env, free_port, run_job, run_plain


def _succeeded(job: JobResult, ranks: int) -> JobResult:
    assert job.returncodes and all(rc == 0 for rc in job.returncodes), job.describe()
    assert sorted(job.results) == list(range(ranks)), job.describe()
    return job


@pytest.fixture(scope="module")
def exchange(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    """torchrun --nproc-per-node 2: the stub over the job's TCPStore, gpu/tpu configuration, cpu clients."""
    job = run_job("exchange", tmp_path_factory.mktemp("exchange"), nproc=2, env=clean_env(CPU_NUM_DEVICES="2"))
    return _succeeded(job, 2)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    """Two torchrun agents (--nnodes 2 --node-rank 0/1) x 2 processes, over an initialized gloo process group."""
    job = run_job("two_hosts", tmp_path_factory.mktemp("two_hosts"), nproc=2, nnodes=2)
    return _succeeded(job, 4)


# -- one host, two processes -----------------------------------------------------------------


def test_rank_hooks_report_torchruns_values_in_every_process(exchange):
    for rank, seen in exchange.results.items():
        for plugin, hooks in seen["hooks"].items():
            assert hooks == {"local_rank": rank, "local_world_size": 2, "host_index": 0}, plugin
        assert seen["process_info"] == {
            "rank": rank, "world_size": 2, "local_rank": rank, "local_world_size": 2, "host_index": 0,
        }  # fmt: skip


def test_each_process_sees_every_stub_device_and_addresses_only_its_own(exchange):
    for rank, seen in exchange.results.items():
        stub = seen["stub"]
        assert stub["platform"] == "neuron"
        assert stub["process_index"] == rank
        assert stub["devices"] == [[0, 0, rank == 0], [1, 1, rank == 1]]
        assert stub["addressable"] == [rank]


def test_processes_land_on_different_devices_not_all_on_device_0(exchange):
    stubs = [exchange.results[rank]["stub"] for rank in (0, 1)]
    # configure_multiprocess ran before the client: one NeuronCore each, the local rank's.
    assert [s["env"]["NEURON_RT_VISIBLE_CORES"] for s in stubs] == ["0", "1"]
    assert [s["env"]["NEURON_PJRT_PROCESS_INDEX"] for s in stubs] == ["0", "1"]
    # A buffer put on "the default device" goes to each process's own device.
    assert [s["buffer_device"] for s in stubs] == [0, 1]
    assert all(s["roundtrip"] == [0.0, 1.0, 2.0, 3.0] for s in stubs)


def test_stub_keys_live_in_torchs_store_under_the_plugin_namespace(exchange):
    for seen in exchange.results.values():
        stub = seen["stub"]
        assert stub["has_kv"] and stub["kv_prefix"] == "pjrt_plugins/stub-neuron/0/"
        assert stub["kv_address"] == f"TCPStore at 127.0.0.1:{seen['env']['MASTER_PORT']}"
        assert stub["store_has"] == {"namespaced": [True, True], "bare": False}
        assert stub["live_kv_values"] == 0  # the plugin called the deleter of every value it got


def test_gpu_gives_each_process_its_own_device_and_the_global_ranks(exchange):
    for rank, seen in exchange.results.items():
        assert seen["gpu"] == {"visible_devices": [rank], "node_id": rank, "num_nodes": 2, "requires_coordinator": True}


def test_tpu_configure_multiprocess_sets_one_chip_per_process(exchange):
    for rank, seen in exchange.results.items():
        assert seen["tpu"] == {
            "TPU_VISIBLE_CHIPS": str(rank),
            "TPU_PROCESS_BOUNDS": "1,2,1",
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_PORT": str(8476 + rank),
            "TPU_PROCESS_ADDRESSES": "localhost:8476,localhost:8477",
            "CLOUD_TPU_TASK_ID": str(rank),
        }


def test_cpu_processes_get_independent_clients(exchange):
    for seen in exchange.results.values():
        cpu = seen["cpu"]
        assert cpu["platform"] == "cpu"
        assert cpu["has_kv"] is False  # no store: the CPU library has no use for one
        assert cpu["process_index"] == 0
        assert cpu["devices"] == [[0, 0, True], [1, 0, True]]  # CPU_NUM_DEVICES=2 of its own
        assert cpu["roundtrip"] == [0.0, 1.0, 2.0, 3.0]


# -- two hosts -----------------------------------------------------------------------------


@pytest.mark.slow  # the job behind it: 6 processes, ~20 s on 2 cores
def test_two_hosts_host_index_and_ranks_follow_the_node_rank(two_hosts):
    for rank, seen in two_hosts.results.items():
        host, local = divmod(rank, 2)
        for plugin in ("stub_neuron", "cpu", "gpu"):
            assert seen["hooks"][plugin] == {"local_rank": local, "local_world_size": 2, "host_index": host}, plugin
        # tpu's host index is the TPU worker id, which only a TPU slice sets.
        assert seen["hooks"]["tpu"]["host_index"] == 0
        assert seen["process_info"] == {
            "rank": rank, "world_size": 4, "local_rank": local, "local_world_size": 2, "host_index": host,
        }  # fmt: skip


@pytest.mark.slow  # the job behind it: 6 processes, ~20 s on 2 cores
def test_two_hosts_share_one_device_list_over_the_default_process_groups_store(two_hosts):
    for rank, seen in two_hosts.results.items():
        stub = seen["stub"]
        assert seen["store_is_default_pg"] is True
        assert stub["process_index"] == rank
        assert stub["devices"] == [[d, d, d == rank] for d in range(4)]
        assert stub["addressable"] == [rank] and stub["buffer_device"] == rank
        assert stub["env"]["NEURON_RT_VISIBLE_CORES"] == str(rank % 2)  # each host hands out its own cores
        assert stub["env"]["NEURON_PJRT_PROCESS_INDEX"] == str(rank)  # the second host does not claim 0
        assert stub["store_has"] == {"namespaced": [True] * 4, "bare": False}


# -- without torchrun ---------------------------------------------------------------------


def test_without_torchrun_rank_0_hosts_the_store_for_its_peers(tmp_path):
    """Another launcher sets the same variables, without torchrun's agent store: torch's env:// rule applies."""
    port = str(free_port())
    envs = [
        clean_env(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2",
            LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", GROUP_RANK="0", CPU_NUM_DEVICES="1",
        )  # fmt: skip
        for rank in (0, 1)
    ]
    job = _succeeded(run_plain("exchange", tmp_path, envs=envs), 2)
    for rank, seen in job.results.items():
        assert seen["stub"]["devices"] == [[0, 0, rank == 0], [1, 1, rank == 1]]
        assert seen["stub"]["buffer_device"] == rank
        assert seen["stub"]["kv_address"] == f"TCPStore at 127.0.0.1:{port}"


# -- failures ------------------------------------------------------------------------------


def test_a_peer_that_never_arrives_is_a_clear_timeout(tmp_path):
    job = _succeeded(run_job("absent_peer", tmp_path, nproc=2), 2)
    seen = job.results[0]
    assert seen["error_type"] == "PjrtError" and seen["code"] == "DEADLINE_EXCEEDED"
    assert "gave up waiting 1500 ms for node 1" in seen["message"]
    assert "'pjrt_plugins/stub-neuron/0/stub_neuron/devices/1'" in seen["message"]  # which key is missing
    assert f"TCPStore at 127.0.0.1:{seen['env']['MASTER_PORT']}" in seen["message"]
    assert "all 2 processes are running" in seen["hint"]
    assert seen["after"]["roundtrip"] == [0.0, 1.0, 2.0, 3.0]  # and the process goes on
    assert job.results[1] == {**job.results[1], "left": True}


def test_a_failing_store_is_a_python_error_and_the_process_survives(tmp_path):
    job = run_plain("dead_store", tmp_path, envs=[clean_env(RANK="0", WORLD_SIZE="2")])
    assert job.returncodes == [0], job.describe()
    seen = job.results[0]
    assert seen["error_type"] == "PjrtError", seen
    assert seen["code"] == "UNAVAILABLE"  # a lost store is UNAVAILABLE, not UNKNOWN
    assert "ConnectionError" in seen["message"]
    assert f"TCPStore at 127.0.0.1:{seen['port']}" in seen["message"]
    assert "pjrt_plugins/stub-neuron/0/stub_neuron/devices/" in seen["message"]
    assert seen["after"]["platform"] == "neuron" and len(seen["after"]["devices"]) == 4

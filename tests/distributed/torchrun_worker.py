"""One process of a test job: runs a scenario with the real plugins and writes what it saw as JSON.

Usage: ``python -m torch.distributed.run ... torchrun_worker.py <scenario> <out_dir>`` (or plain
``python`` for the scenarios that make their own store). A watchdog dumps the stack and exits
if the scenario hangs, so no worker outlives its test.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import pjrt_plugins
from pjrt_plugins import PjrtError, distributed

HOOKED_PLUGINS = ("stub_neuron", "cpu", "gpu", "tpu")


def hooks() -> dict[str, dict[str, int]]:
    """The rank, world-size and host-index hooks of every backend, as this process sees them."""
    seen = {}
    for name in HOOKED_PLUGINS:
        plugin = pjrt_plugins.get_plugin(name)
        seen[name] = {
            "local_rank": plugin.local_process_rank(),
            "local_world_size": plugin.local_world_size(),
            "host_index": plugin.host_index(),
        }
    return seen


def describe_client(client: Any) -> dict[str, Any]:
    buffer = client.buffer_from_host(np.arange(4, dtype=np.float32))  # no device named: the default one
    return {
        "platform": client.platform_name,
        "process_index": client.process_index,
        "devices": [[d.id, d.process_index, d.is_addressable] for d in client.devices],
        "addressable": [d.id for d in client.addressable_devices],
        "buffer_device": buffer.device.id,
        "roundtrip": buffer.to_numpy().tolist(),
        "has_kv": client._kv is not None,
        "live_kv_values": client._kv.live_values if client._kv is not None else None,
        "kv_prefix": client._kv.store.prefix if client._kv is not None else None,
        "kv_address": client._kv.store.address if client._kv is not None else None,
    }


def stub_exchange(result: dict[str, Any]) -> Any:
    """Create the stub client through pjrt_plugins.distributed and record its view of the job."""
    info = distributed.process_info("stub_neuron")
    result["process_info"] = info.__dict__
    client = distributed.create_client("stub_neuron", {"kv_timeout_ms": 20000})
    result["stub"] = describe_client(client)
    result["stub"]["env"] = {
        name: os.environ.get(name)
        for name in ("NEURON_RT_VISIBLE_CORES", "NEURON_PJRT_PROCESS_INDEX", "NEURON_PJRT_PROCESSES_NUM_DEVICES")
    }
    # The keys are in torch.distributed's own store, under the plugin's namespace only.
    store = distributed.default_store()
    result["stub"]["store_has"] = {
        "namespaced": [
            store.check([f"pjrt_plugins/stub-neuron/0/stub_neuron/devices/{n}"]) for n in range(info.world_size)
        ],
        "bare": store.check(["stub_neuron/devices/0"]),
    }
    return client


def scenario_exchange(result: dict[str, Any]) -> None:
    result["hooks"] = hooks()
    client = stub_exchange(result)
    client.close()
    # gpu: one GPU per process, through its create options (no GPU here to create a client on).
    gpu = pjrt_plugins.get_plugin("gpu")
    options = gpu.client_create_options()
    result["gpu"] = {key: options.get(key) for key in ("visible_devices", "node_id", "num_nodes")}
    result["gpu"]["requires_coordinator"] = gpu.requires_coordinator()
    # tpu: configure_multiprocess sets libtpu's topology variables (the library is never opened here).
    tpu = pjrt_plugins.get_plugin("tpu")
    tpu.configure_multiprocess(tpu.local_process_rank(), tpu.local_world_size())
    result["tpu"] = {
        name: os.environ.get(name)
        for name in (
            "TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_PORT",
            "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID",
        )  # fmt: skip
    }
    # cpu: an independent client per process, no store involved.
    with distributed.create_client("cpu") as cpu_client:
        result["cpu"] = describe_client(cpu_client)
    store_barrier("exchange", result["process_info"]["world_size"])


def store_barrier(name: str, world_size: int) -> None:
    """Wait for every rank: without torchrun rank 0 hosts the store and must outlive its peers' use of it."""
    from datetime import timedelta

    store = distributed.default_store()
    store.set(f"test/{name}/done/{os.environ['RANK']}", "1")
    store.wait([f"test/{name}/done/{n}" for n in range(world_size)], timedelta(seconds=30))


def scenario_absent_peer(result: dict[str, Any]) -> None:
    """Rank 0 waits for a peer; every other rank leaves without creating a client."""
    if int(os.environ["RANK"]) != 0:
        result["left"] = True
        return
    start = time.monotonic()
    try:
        distributed.create_client("stub_neuron", {"kv_timeout_ms": 1500})
    except PjrtError as error:
        result["error_type"] = type(error).__name__
        result["code"] = error.code_name
        result["message"] = error.message
        result["hint"] = error.hint
    result["elapsed_s"] = time.monotonic() - start
    with distributed.create_client("cpu") as client:  # the process carries on
        result["after"] = describe_client(client)


def scenario_two_hosts(result: dict[str, Any]) -> None:
    """Like exchange, over torch.distributed's default process group (gloo) across two torchrun agents."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        result["hooks"] = hooks()
        client = stub_exchange(result)
        result["store_is_default_pg"] = client._kv.store.store is dist.distributed_c10d._get_default_store()
        client.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def scenario_dead_store(result: dict[str, Any]) -> None:
    """The store's server goes away before the client is created: a Python error here, and the process goes on."""
    import gc
    from datetime import timedelta

    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    port = server.port
    store = dist.TCPStore("127.0.0.1", port, 1, False, timeout=timedelta(seconds=1))  # gives up quickly
    store.set("alive", "1")
    del server  # the last reference: the server stops and closes its connections
    gc.collect()
    result["port"] = port
    try:
        distributed.create_client("stub_neuron", {"kv_timeout_ms": 5000}, store=store)
    except PjrtError as error:
        result["error_type"] = type(error).__name__
        result["code"] = error.code_name
        result["message"] = error.message
    with pjrt_plugins.get_plugin("stub_neuron").create_client(configure=False) as client:  # still fine
        result["after"] = describe_client(client)


def _record_failure(result: dict[str, Any], error: BaseException) -> None:
    result["error_type"] = type(error).__name__
    result["message"] = getattr(error, "message", None) or str(error)
    result["code"] = getattr(error, "code_name", None)


def scenario_reach_store(result: dict[str, Any]) -> None:
    """Only reach the job's store (PJRT_PLUGINS_STORE_TIMEOUT bounds it), timing the wait alone."""
    import torch.distributed  # noqa: F401 - loaded before the clock starts

    start = time.monotonic()
    try:
        distributed.default_store()
    except pjrt_plugins.DistributedSetupError as error:
        _record_failure(result, error)
    result["elapsed_s"] = time.monotonic() - start


def scenario_check_in(result: dict[str, Any]) -> None:
    """Reach the store, wait PJRT_TEST_CREATE_DELAY_S (as processes of a job started seconds apart do),
    then create the stub client; the error, if any, is recorded and the process goes on."""
    import torch.distributed  # noqa: F401

    delay = float(os.environ.get("PJRT_TEST_CREATE_DELAY_S", "0"))
    try:
        if int(os.environ["RANK"]) < int(os.environ["WORLD_SIZE"]):  # a rank outside the job has no store to reach
            distributed.default_store()
        time.sleep(delay)
        start = time.monotonic()
        with distributed.create_client("stub_neuron", {"kv_timeout_ms": 20000}) as client:
            result["devices"] = len(client.devices)
    except (pjrt_plugins.DistributedSetupError, PjrtError) as error:
        _record_failure(result, error)
    result["survived"] = True


def scenario_peer_bound(result: dict[str, Any]) -> None:
    """Rank 0 creates the stub client without kv_timeout_ms (the stub waits 30 s by default); rank 1 leaves."""
    if int(os.environ["RANK"]) != 0:
        result["left"] = True
        return
    import torch.distributed  # noqa: F401

    start = time.monotonic()
    try:
        distributed.create_client("stub_neuron")
    except (pjrt_plugins.DistributedSetupError, PjrtError) as error:
        _record_failure(result, error)
    result["elapsed_s"] = time.monotonic() - start


def scenario_host_dies(result: dict[str, Any]) -> None:
    """Rank 0 hosts the store and exits once rank 1 is connected; rank 1 then creates the stub client."""
    import socket

    store = distributed.default_store()
    if int(os.environ["RANK"]) == 0:
        from datetime import timedelta

        store.wait(["test/connected"], timedelta(seconds=30))
        os._exit(0)  # the store's host goes away, as a crashed rank 0 would
    store.set("test/connected", "1")
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    for _ in range(300):  # until the port refuses connections: the host is gone
        try:
            socket.create_connection(address, timeout=1).close()
        except ConnectionRefusedError:
            break
        time.sleep(0.1)
    start = time.monotonic()
    try:
        distributed.create_client("stub_neuron", {"kv_timeout_ms": 20000})
    except (pjrt_plugins.DistributedSetupError, PjrtError) as error:
        _record_failure(result, error)
    result["elapsed_s"] = time.monotonic() - start
    with pjrt_plugins.get_plugin("stub_neuron").create_client(configure=False) as client:  # the process goes on
        result["after"] = len(client.devices)


SCENARIOS: dict[str, Callable[[dict[str, Any]], None]] = {
    "reach_store": scenario_reach_store,
    "check_in": scenario_check_in,
    "peer_bound": scenario_peer_bound,
    "host_dies": scenario_host_dies,
    "exchange": scenario_exchange,
    "absent_peer": scenario_absent_peer,
    "two_hosts": scenario_two_hosts,
    "dead_store": scenario_dead_store,
}


def main() -> int:
    scenario, out_dir = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ.get("RANK", "0"))
    (out_dir / f"pid.{rank}.{os.getpid()}").touch()  # lets the test kill this process by id
    faulthandler.dump_traceback_later(float(os.environ.get("PJRT_TEST_WORKER_WATCHDOG_S", "60")), exit=True)
    label = os.environ.get("PJRT_TEST_LABEL")  # names the result when two processes share a rank
    result: dict[str, Any] = {
        "rank": rank,
        "label": label,
        "env": {
            name: os.environ.get(name)
            for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT")
        },
    }
    status = 0
    try:
        SCENARIOS[scenario](result)
    except BaseException:  # noqa: BLE001 - reported to the test
        result["error"] = traceback.format_exc()
        status = 1
    (out_dir / f"{scenario}.{label or rank}.json").write_text(json.dumps(result, indent=1, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())

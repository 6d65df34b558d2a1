"""TorchStoreKV against a real TCPStore on loopback, alone and as the KV store of real stub clients."""

from __future__ import annotations

import gc
import threading
from datetime import timedelta

import numpy as np
import pytest
from _support import run_on_threads

import pjrt_plugins
from pjrt_plugins import PjrtError, distributed
from pjrt_plugins.distributed import TorchStoreKV


def test_put_get_and_try_get_round_trip_bytes_under_the_prefix(tcp_store, store_client):
    kv = TorchStoreKV(store_client, prefix="pjrt_plugins/x/0/")
    kv.put("k", b"\x00\xffbinary")
    assert kv.get("k", 1000) == b"\x00\xffbinary"
    assert kv.try_get("k") == b"\x00\xffbinary"
    assert kv.try_get("absent") is None
    assert tcp_store.get("pjrt_plugins/x/0/k") == b"\x00\xffbinary"  # what the other processes see
    assert not tcp_store.check(["k"])


def test_get_waits_for_a_key_another_process_puts_later(tcp_store, store_client):
    kv = TorchStoreKV(store_client, prefix="p/")
    timer = threading.Timer(0.2, lambda: tcp_store.set("p/late", b"here"))
    timer.start()
    try:
        assert kv.get("late", 20000) == b"here"
    finally:
        timer.cancel()


def test_get_timeout_names_the_key_the_full_key_and_the_store(store_client):
    kv = TorchStoreKV(store_client, prefix="pjrt_plugins/stub_neuron/0/")
    with pytest.raises(TimeoutError) as info:
        kv.get("stub_neuron/devices/1", 200)
    text = str(info.value)
    assert "'stub_neuron/devices/1'" in text
    assert "'pjrt_plugins/stub_neuron/0/stub_neuron/devices/1'" in text
    assert f"TCPStore at 127.0.0.1:{store_client.port}" in text
    # The connection is still good afterwards.
    kv.put("after", b"1")
    assert kv.get("after", 1000) == b"1"


def test_a_get_blocked_on_one_thread_does_not_hold_up_a_put_on_another(store_client):
    # One TCPStore connection serves one request at a time: sharing it, this put would
    # wait for the get to time out (20 s) and the get would fail.
    kv = TorchStoreKV(store_client, prefix="t/")
    got: list[bytes] = []
    waiter = threading.Thread(target=lambda: got.append(kv.get("k", 20000)))
    waiter.start()
    try:
        threading.Event().wait(0.2)  # let the waiter block first
        kv.put("k", b"v")
        waiter.join(10)
        assert not waiter.is_alive(), "the get was held up behind the put's connection"
        assert got == [b"v"]
    finally:
        waiter.join(30)


def test_a_store_whose_server_went_away_raises_connection_error_naming_it():
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    port = server.port
    client = dist.TCPStore("127.0.0.1", port, 1, False, timeout=timedelta(seconds=1))
    kv = TorchStoreKV(client, prefix="p/")
    kv.put("alive", b"1")  # this thread's connection is open
    del server  # the last reference: the server stops and closes its connections
    gc.collect()
    with pytest.raises(ConnectionError, match=rf"TCPStore at 127.0.0.1:{port}.*'p/k'"):
        for _ in range(3):  # the first write after the peer left may still be accepted by the socket
            kv.put("k", b"v")
            kv.get("k", 1000)


def test_only_a_torch_store_is_accepted():
    with pytest.raises(TypeError, match="torch.distributed Store"):
        TorchStoreKV({"not": "a store"})


def test_two_stub_nodes_exchange_devices_through_tcpstore(tcp_store):
    """Two clients of one process stand for two processes; each has its own store connection."""
    import torch.distributed as dist

    stub = pjrt_plugins.get_plugin("stub_neuron")
    clients: dict[int, object] = {}

    def node(node_id: int) -> None:
        connection = dist.TCPStore("127.0.0.1", tcp_store.port, 1, False, timeout=timedelta(seconds=30))
        options = {"node_id": node_id, "num_nodes": 2, "num_devices": 1 + node_id, "kv_timeout_ms": 20000}
        clients[node_id] = distributed.create_client(stub, options, store=connection, namespace="job/", configure=False)

    run_on_threads(node, [(0,), (1,)])
    try:
        assert tcp_store.get("job/stub_neuron/devices/0") == b"v1 num_devices=1"
        assert tcp_store.get("job/stub_neuron/devices/1") == b"v1 num_devices=2"
        for node_id, client in clients.items():
            assert [(d.id, d.process_index) for d in client.devices] == [(0, 0), (1, 1), (2, 1)]
            assert [d.process_index for d in client.addressable_devices] == [node_id] * (1 + node_id)
            buffer = client.buffer_from_host(np.full(2, node_id))
            assert buffer.device.process_index == node_id
    finally:
        for client in clients.values():
            client.close()


def test_a_missing_peer_through_create_client_is_deadline_exceeded_with_a_hint(store_client, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(PjrtError) as info:
        distributed.create_client("stub_neuron", {"kv_timeout_ms": 300}, store=store_client, configure=False)
    assert info.value.code_name == "DEADLINE_EXCEEDED"
    assert "gave up waiting 300 ms for node 1" in info.value.message
    assert "all 2 processes are running" in info.value.hint


def test_a_long_get_logs_which_key_it_still_waits_for(store_client, monkeypatch, caplog):
    monkeypatch.setattr(distributed, "WAIT_SLICE_S", 0.1)
    kv = TorchStoreKV(store_client, prefix="job/")
    with caplog.at_level("WARNING", logger="pjrt_plugins.distributed"), pytest.raises(TimeoutError):
        kv.get("slow", 350)
    waiting = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert waiting and all("'job/slow'" in message for message in waiting)

"""The stub's device exchange over a KV store, through the runtime's real KV callbacks.

Several clients in one process stand for the processes of a job: each is created with
``num_nodes``/``node_id`` on its own thread and they meet in a shared in-memory store.
(The torchrun tests of pjrt_plugins.distributed run the same exchange over TCPStore.)
"""

from __future__ import annotations

import time

import pytest
from _support import run_on_threads
from stub_neuron_testkit import InMemoryKvStore

from pjrt_plugins import PjrtError
from pjrt_plugins.runtime import Client


def _create_nodes(stub, store, devices_per_node: list[int], timeout_ms: int = 20000) -> list[Client]:
    clients: list[Client | None] = [None] * len(devices_per_node)

    def create(node: int) -> None:
        options = {
            "num_devices": devices_per_node[node],
            "node_id": node,
            "num_nodes": len(devices_per_node),
            "kv_timeout_ms": timeout_ms,
        }
        clients[node] = stub.create_client(options, configure=False, kv_store=store)

    run_on_threads(create, [(n,) for n in range(len(devices_per_node))])
    return clients  # type: ignore[return-value]


def test_every_node_sees_all_devices_and_addresses_only_its_own(stub):
    store = InMemoryKvStore()
    clients = _create_nodes(stub, store, [2, 1, 3])
    try:
        assert sorted(store.puts) == [
            ("stub_neuron/devices/0", b"v1 num_devices=2"),
            ("stub_neuron/devices/1", b"v1 num_devices=1"),
            ("stub_neuron/devices/2", b"v1 num_devices=3"),
        ]
        owners = [0, 0, 1, 2, 2, 2]
        for node, client in enumerate(clients):
            assert client.process_index == node
            assert [d.id for d in client.devices] == [0, 1, 2, 3, 4, 5]
            assert [d.process_index for d in client.devices] == owners
            assert [d.id for d in client.addressable_devices] == [i for i, o in enumerate(owners) if o == node]
            assert [d.is_addressable for d in client.devices] == [o == node for o in owners]
            assert [m.id for m in client.memories] == [d.id for d in client.addressable_devices]
            # Data goes to the node's own devices, never to device 0 of node 0.
            mine = client.addressable_devices[-1]
            assert client.buffer_from_host([node, node], device=mine).to_numpy().tolist() == [node, node]
    finally:
        for client in clients:
            client.close()


def test_a_peer_device_is_not_addressable_for_uploads(stub):
    clients = _create_nodes(stub, InMemoryKvStore(), [1, 1])
    try:
        other = clients[0].devices[1]
        assert other.process_index == 1 and not other.is_addressable
        with pytest.raises(PjrtError) as info:
            clients[0].buffer_from_host([1.0], device=other)
        assert info.value.code_name == "INVALID_ARGUMENT"
        assert "not addressable from process 0" in info.value.message
    finally:
        for client in clients:
            client.close()


def test_a_peer_that_never_arrives_is_a_bounded_timeout(stub):
    start = time.monotonic()
    with pytest.raises(PjrtError) as info:
        stub.create_client(
            {"num_nodes": 2, "node_id": 0, "kv_timeout_ms": 300}, configure=False, kv_store=InMemoryKvStore()
        )
    assert time.monotonic() - start < 10
    assert info.value.code_name == "DEADLINE_EXCEEDED"
    assert "gave up waiting 300 ms for node 1" in info.value.message
    assert "stub_neuron/devices/1" in info.value.message


def test_a_failing_store_surfaces_as_an_error_in_the_caller(stub):
    store = InMemoryKvStore(fail_puts_with=ConnectionError("store at 10.0.0.1:29500 went away"))
    with pytest.raises(PjrtError) as info:
        stub.create_client({"num_nodes": 2, "node_id": 1, "kv_timeout_ms": 300}, configure=False, kv_store=store)
    assert "could not publish its devices under key 'stub_neuron/devices/1'" in info.value.message
    assert "went away" in info.value.message
    # The process is fine afterwards.
    with stub.create_client() as c:
        assert len(c.devices) == 4


def test_several_nodes_without_a_store_are_refused(stub):
    with pytest.raises(PjrtError) as info:
        stub.create_client({"num_nodes": 2, "node_id": 0}, configure=False)
    assert info.value.code_name == "INVALID_ARGUMENT"
    assert "needs the KV store callbacks" in info.value.message


def test_node_id_outside_num_nodes_is_refused(stub):
    with pytest.raises(PjrtError, match="node_id=3 is out of range 0..1"):
        stub.create_client({"num_nodes": 2, "node_id": 3}, configure=False, kv_store=InMemoryKvStore())

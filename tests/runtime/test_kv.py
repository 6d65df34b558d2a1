"""KV-store callbacks for PJRT_Client_Create, driven by real C code (a gcc-built plugin, the stub)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from runtime_support import shim_report
from _support import run_on_threads

from pjrt_plugins.runtime import Client, load_library
from pjrt_plugins.runtime._cdef import STRUCT_SIZE, ffi
from pjrt_plugins.runtime._kv import KvCallbacks


class MemoryKvStore:
    """A real in-process KV store (what pjrt_plugins.distributed provides across processes)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.calls: list[tuple[str, str]] = []
        self._cond = threading.Condition()

    def get(self, key: str, timeout_ms: int) -> bytes:
        self.calls.append(("get", key))
        with self._cond:
            if not self._cond.wait_for(lambda: key in self.data, timeout=timeout_ms / 1000):
                raise TimeoutError(f"no key {key!r} after {timeout_ms} ms")
            return self.data[key]

    def try_get(self, key: str) -> bytes | None:
        self.calls.append(("try_get", key))
        with self._cond:
            return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.calls.append(("put", key))
        if key.endswith("boom"):
            raise RuntimeError("this store refuses keys ending in boom")
        with self._cond:
            self.data[key] = bytes(value)
            self._cond.notify_all()


def test_callbacks_through_a_c_plugin(build_shim):
    path = build_shim(SHIM_KV=True)
    store = MemoryKvStore()
    with Client(load_library(path), kv_store=store) as client:
        assert len(client.devices) >= 1
        assert client._kv is not None and client._kv.live_values == 0  # every value was handed back
    entries = shim_report(path).rstrip(";").split(";")
    assert entries[0] == "put=ok"
    assert entries[1] == "get=hello"
    assert entries[2].startswith("error4=kv_store.get('shim/missing') failed: TimeoutError")  # DEADLINE_EXCEEDED
    assert entries[3].startswith("error2=kv_store.put('shim/boom') failed: RuntimeError: this store refuses")
    assert entries[4] == "put=error"
    assert entries[5] == "try_get=hello"
    assert entries[6] == "error5=kv_store has no key 'shim/missing'"  # NOT_FOUND, at once
    assert store.data == {"shim/key": b"hello"}


def test_without_a_store_the_plugin_sees_no_callbacks(build_shim):
    path = build_shim(SHIM_KV=True)
    with Client(load_library(path)):
        pass
    assert shim_report(path) == "no_kv;"


def test_cpu_plugin_ignores_the_store(client8, cpu_library_path):
    store = MemoryKvStore()
    with Client(cpu_library_path, kv_store=store) as client:
        assert client.devices
    assert store.calls == []


def test_store_without_the_protocol_is_refused_before_the_c_call(cpu_library_path):
    class GetOnly:
        def get(self, key, timeout_ms):
            return b""

    with pytest.raises(TypeError, match="no try_get"):
        Client(cpu_library_path, kv_store=GetOnly())


def test_two_stub_nodes_exchange_devices_through_one_store(stub_library):
    path = stub_library
    schema = {"num_devices": int, "node_id": int, "num_nodes": int, "kv_timeout_ms": int}
    store = MemoryKvStore()
    clients: dict[int, Client] = {}

    def node(node_id: int) -> None:
        options = {"num_devices": 2 + node_id, "node_id": node_id, "num_nodes": 2, "kv_timeout_ms": 20000}
        clients[node_id] = Client(path, options, schema=schema, kv_store=store)

    run_on_threads(node, [(0,), (1,)])
    try:
        for node_id, client in clients.items():
            assert len(client.devices) == 5  # 2 + 3 devices across both nodes
            assert len(client.addressable_devices) == 2 + node_id
            buf = client.buffer_from_host(np.arange(3.0))
            np.testing.assert_array_equal(buf.to_numpy(), np.arange(3.0))
    finally:
        for client in clients.values():
            client.close()
    assert {key for op, key in store.calls if op == "put"} == {"stub_neuron/devices/0", "stub_neuron/devices/1"}


# -- the callbacks called directly through their C function pointers ----------------------------


class PluginSide:
    """What a plugin brings to a KV callback: a PJRT_CallbackError it implements."""

    def __init__(self) -> None:
        self.errors: list[tuple[int, str]] = []
        self.token = ffi.new("int*")
        self.create = ffi.callback("PJRT_CallbackError", self._create)
        self.pointer = ffi.new("PJRT_CallbackError*", self.create)

    def _create(self, code, message, size):
        self.errors.append((int(code), ffi.unpack(message, size).decode()))
        return ffi.cast("PJRT_Error*", self.token)


def get_args(plugin: PluginSide, key: bytes, struct_size: int | None = None):
    args = ffi.new("PJRT_KeyValueGetCallback_Args*")
    args.struct_size = STRUCT_SIZE["PJRT_KeyValueGetCallback_Args"] if struct_size is None else struct_size
    keep = ffi.new("char[]", key)
    args.key, args.key_size, args.timeout_in_ms = keep, len(key), 10
    args.callback_error = plugin.pointer
    return args, keep


def test_values_stay_alive_until_the_plugin_deletes_them():
    store = MemoryKvStore()
    store.put("k", b"\x00binary\xffvalue")
    callbacks = KvCallbacks(store)
    plugin = PluginSide()
    args, _keep = get_args(plugin, b"k")
    assert callbacks.get(args) == ffi.NULL
    assert callbacks.live_values == 1
    assert ffi.unpack(args.value, args.value_size) == b"\x00binary\xffvalue"
    args.value_deleter_callback(args.value)
    assert callbacks.live_values == 0
    assert plugin.errors == []


@pytest.mark.parametrize(
    "behaviour, code, text",
    [
        (TimeoutError("late"), 4, "TimeoutError: late"),
        (KeyError("k"), 5, "KeyError"),
        (ValueError("bad"), 3, "ValueError: bad"),
        (KeyboardInterrupt(), 1, "KeyboardInterrupt"),
        (RuntimeError("boom"), 2, "RuntimeError: boom"),
        (12345, 3, "must return bytes"),
    ],
)
def test_store_failures_become_plugin_errors_and_never_unwind(behaviour, code, text):
    class Store:
        def get(self, key, timeout_ms):
            if isinstance(behaviour, BaseException):
                raise behaviour
            return behaviour

        def try_get(self, key):
            return None

        def put(self, key, value):
            pass

    callbacks = KvCallbacks(Store())
    plugin = PluginSide()
    args, _keep = get_args(plugin, b"k")
    result = callbacks.get(args)
    assert result == ffi.cast("PJRT_Error*", plugin.token)  # the plugin's own error object
    assert plugin.errors[0][0] == code and text in plugin.errors[0][1]
    assert callbacks.live_values == 0


def test_a_smaller_args_struct_from_an_older_plugin_is_not_overrun():
    callbacks = KvCallbacks(MemoryKvStore())
    plugin = PluginSide()
    offset = ffi.offsetof("PJRT_KeyValueGetCallback_Args", "value")
    args, _keep = get_args(plugin, b"k", struct_size=offset)  # ends before value/value_size/deleter
    callbacks.get(args)
    assert args.value == ffi.NULL  # nothing written past the plugin's struct
    assert plugin.errors and "lacks value" in plugin.errors[0][1]


def test_str_values_are_sent_as_utf8():
    class Store(MemoryKvStore):
        def try_get(self, key):
            return "héllo"

    callbacks = KvCallbacks(Store())
    plugin = PluginSide()
    args = ffi.new("PJRT_KeyValueTryGetCallback_Args*")
    args.struct_size = STRUCT_SIZE["PJRT_KeyValueTryGetCallback_Args"]
    key = ffi.new("char[]", b"k")
    args.key, args.key_size, args.callback_error = key, 1, plugin.pointer
    assert callbacks.try_get(args) == ffi.NULL
    assert ffi.unpack(args.value, args.value_size) == "héllo".encode()
    args.value_deleter_callback(args.value)
    assert callbacks.live_values == 0


def test_plugins_older_than_0_61_get_no_try_get_callback(build_shim):
    # kv_try_get_callback was appended to PJRT_Client_Create_Args in 0.61.
    path = build_shim(SHIM_KV=True, SHIM_MINOR=60)
    with Client(load_library(path), kv_store=MemoryKvStore()):
        pass
    assert shim_report(path).endswith("no_try_get;")

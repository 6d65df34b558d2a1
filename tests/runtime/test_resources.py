"""No leaks, several threads at once, and the GIL released while the plugin works."""

from __future__ import annotations

import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from runtime_support import ADD_F32_4, busy_loop, identity

from pjrt_plugins.runtime import Buffer, Client


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def churn(client: Client, buffers: int, executables: int) -> None:
    data = np.arange(256, dtype=np.float32)
    for i in range(buffers):
        buf = client.buffer_from_host(data, copy=(i % 2 == 0))
        if i % 3 == 0:
            buf.to_numpy()
        del buf
    for i in range(executables):
        exe = client.compile(identity(f"tensor<{i % 7 + 1}xf32>"))
        x = client.buffer_from_host(np.ones(i % 7 + 1, np.float32))
        exe.execute([[x]])[0][0].to_numpy()
        del exe, x


def test_buffers_and_executables_do_not_leak(cpu_library_path):
    with Client(cpu_library_path) as client:
        churn(client, 2_000, 20)  # warm-up: allocator pools, compiler caches
        gc.collect()
        before = rss_bytes()
        churn(client, 10_000, 100)
        gc.collect()
        grown = rss_bytes() - before
        assert not client._live_buffers and not client._live_executables
        assert not client._pending_host
    # Measured here: ~0.05 MiB. Leaking the 10,000 buffers costs ~26 MiB, leaking the 100
    # executables ~8 MiB, so this bound catches either while leaving room for allocator noise.
    assert grown < 6 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MiB"


def test_many_threads_share_one_client(client8):
    exe = client8.compile(ADD_F32_4)

    def work(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        for _ in range(100):
            a = rng.standard_normal(4).astype(np.float32)
            b = rng.standard_normal(4).astype(np.float32)
            x = client8.buffer_from_host(a)
            y = client8.buffer_from_host(b)
            out = exe.execute([[x, y]])[0][0].to_numpy()
            if not np.array_equal(out, a + b):
                return False
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(work, range(16)))


def test_threads_compile_and_create_clients_concurrently(cpu_library_path):
    def work(i: int) -> float:
        with Client(cpu_library_path) as client:
            exe = client.compile(identity(f"tensor<{i + 1}xf32>"))
            x = client.buffer_from_host(np.full(i + 1, i, np.float32))
            return float(exe.execute([[x]])[0][0].to_numpy().sum())

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(work, range(6))) == [float(i * (i + 1)) for i in range(6)]


@pytest.mark.parametrize("call", ["execute", "compile"])
def test_the_gil_is_released_during_plugin_calls(client8, call):
    """While one thread sits in a long C call, Python code on another thread keeps running."""
    exe = client8.compile(busy_loop(30_000_000))
    start = client8.buffer_from_host(np.array(0, np.int64))
    exe.execute([[start]])[0][0].to_numpy()  # warm
    window: dict[str, float] = {}

    def long_call() -> None:
        window["start"] = time.perf_counter()
        if call == "execute":
            exe.execute([[start]])[0][0].block_until_ready()
        else:
            client8.compile(busy_loop(12_345_678 + int(window["start"]) % 1000))
        window["end"] = time.perf_counter()

    worker = threading.Thread(target=long_call)
    ticks: list[float] = []
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    inside = [t for t in ticks if window["start"] < t < window["end"]]
    # With the GIL held for the whole call this thread could not have run inside the window.
    assert len(inside) > 100, f"{len(inside)} ticks during a {window['end'] - window['start']:.3f} s call"


def _fan_out(outputs: int) -> str:
    """A program returning its argument ``outputs`` times."""
    types = ", ".join(["tensor<4xf32>"] * outputs)
    values = ", ".join(["%a"] * outputs)
    return f"""
module @fan_out {{
  func.func public @main(%a: tensor<4xf32>) -> ({types}) {{
    return {values} : {types}
  }}
}}
"""


def test_an_output_buffer_brings_no_object_of_its_own_for_the_garbage_collector(client8):
    """An execute's output is a Buffer and the client's registry entry for it, nothing more the garbage collector
    tracks.

    A replayed training step makes about 1,300 output buffers; one container more each (as the list of calls in
    flight every buffer had) doubled the collections the step triggers and the objects they promote to the old
    generations: 4 ms a step on average in collections (``docs/benchmarks.md``)."""
    exe = client8.compile(_fan_out(64))
    x = client8.buffer_from_host(np.arange(4, dtype=np.float32))
    for _ in range(2):  # the first calls make the frames and learn the outputs' facts
        exe.execute([[x]])
    gc.collect()
    before = {id(o) for o in gc.get_objects()}
    [row] = exe.execute([[x]])
    after = gc.get_objects()
    entries = {id(entry) for entry in client8._live_buffers.values()}
    made = [o for o in after if id(o) not in before and o is not before and o is not row]
    others = [type(o).__name__ for o in made if not isinstance(o, Buffer) and id(o) not in entries]
    assert len(row) == 64 and row[-1].to_numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert sum(isinstance(o, Buffer) for o in made) == 64
    assert len(others) <= 4, f"{len(others)} objects tracked beside 64 output buffers: {sorted(set(others))}"

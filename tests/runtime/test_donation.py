"""Input-output aliasing on the real CPU plugin: an argument marked ``tf.aliasing_output`` is donated.

The plugin writes the output into the argument's memory and marks the argument's buffer deleted; the
runtime's Buffer then refuses to be read with a clear error, and frees its handle once (no double free).
Run with the compiled fast path and without it (``PJRT_PLUGINS_FASTPATH=0``, in a subprocess).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from runtime_support import CPU_OPTION_SCHEMA, busy_loop, identity, spmd_square_and_sum

from pjrt_plugins.errors import BufferViewedError
from pjrt_plugins.runtime import Client, CompileOptions, PjrtError

#: ``x + y``, with ``x`` donated to the result (what jax emits for ``donate_argnums=0``).
DONATING_ADD = """
module @donating_add {
  func.func public @main(%x: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %y: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %x, %y : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""


def _f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def test_a_donated_argument_is_deleted_and_its_output_is_right(client8):
    exe = client8.compile(DONATING_ADD)
    x = client8.buffer_from_host(_f32([1, 2, 3, 4]))
    y = client8.buffer_from_host(_f32([10, 20, 30, 40]))
    [[out]] = exe.execute([[x, y]])
    np.testing.assert_array_equal(out.to_numpy(), [11, 22, 33, 44])
    assert x.is_deleted  # donated: the plugin dropped it
    assert not y.is_deleted  # not marked: still there
    np.testing.assert_array_equal(y.to_numpy(), [10, 20, 30, 40])
    with pytest.raises(PjrtError):
        x.to_numpy()
    # A donated buffer cannot be an argument again: a clear error, nothing runs.
    with pytest.raises((PjrtError, ValueError)):
        exe.execute([[x, y]])
    x.delete()  # frees the handle once; a second delete is a no-op
    x.delete()
    # The output is a normal buffer: donating it again in a loop works step after step.
    for step in range(3):
        [[nxt]] = exe.execute([[out, y]])
        assert out.is_deleted
        out = nxt
    np.testing.assert_array_equal(out.to_numpy(), [41, 82, 123, 164])


def test_the_same_buffer_donated_and_read_in_one_call_is_refused(client8):
    exe = client8.compile(DONATING_ADD)
    x = client8.buffer_from_host(_f32([1, 2, 3, 4]))
    with pytest.raises(PjrtError):
        exe.execute([[x, x]])
    np.testing.assert_array_equal(x.to_numpy(), [1, 2, 3, 4])  # refused before anything ran


def _run_without_the_fast_path(cpu_library_path, body: str) -> None:
    """Run ``body`` in a child with ``PJRT_PLUGINS_FASTPATH=0``; it finds ``np``, ``PjrtError``, a one-device CPU
    ``client`` and ``exe`` (DONATING_ADD), and must leave the client closable."""
    code = textwrap.dedent(f"""
        import numpy as np
        from pjrt_plugins.runtime import Client, PjrtError, _fastpath
        assert _fastpath.library is None
        client = Client({str(cpu_library_path)!r}, {{"cpu_device_count": 1}}, schema={{"cpu_device_count": int}},
                        plugin_name="cpu")
        exe = client.compile({DONATING_ADD!r})
    """) + textwrap.dedent(body) + "client.close()\nprint('ok')\n"
    env = dict(os.environ, PJRT_PLUGINS_FASTPATH="0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")


def test_donation_without_the_compiled_fast_path(cpu_library_path):
    _run_without_the_fast_path(cpu_library_path, """
        x = client.buffer_from_host(np.arange(4, dtype=np.float32))
        y = client.buffer_from_host(np.ones(4, dtype=np.float32))
        [[out]] = exe.execute([[x, y]])
        assert x.is_deleted and not y.is_deleted
        assert out.to_numpy().tolist() == [1, 2, 3, 4]
        try:
            x.to_numpy()
        except PjrtError:
            pass
        else:
            raise AssertionError("a donated buffer was read")
        del x, out
    """)


# -- recycling given-up buffers (execute(recycle=...)) ----------------------------------------------------------


def _computed(client, array: np.ndarray, device=None):
    """A buffer an execute made (an upload may still hold its host memory, and such a buffer is deleted, not reused)."""
    kind = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32"}[array.dtype]
    exe = client.compile(identity(f"tensor<{'x'.join(map(str, array.shape))}x{kind}>"))
    [[out]] = exe.execute([[client.buffer_from_host(array, device=device)]], device=device)
    return out


def test_a_recycled_buffer_takes_the_outputs_dtype(client8):
    exe = client8.compile(DONATING_ADD)
    ints = _computed(client8, np.arange(3, dtype=np.int32))
    [[out]] = exe.execute([[client8.buffer_from_host(_f32([1, 2, 3, 4])), client8.buffer_from_host(_f32([1] * 4))]],
                          recycle=[[ints]])
    assert out is ints and out.dtype == np.float32 and out.shape == (4,)
    np.testing.assert_array_equal(out.to_numpy(), [2, 3, 4, 5])


def test_a_recycled_donated_buffer_comes_back_as_the_output_step_after_step(client8):
    exe = client8.compile(DONATING_ADD)
    x = _computed(client8, _f32([1, 2, 3, 4]))
    y = client8.buffer_from_host(_f32([10, 20, 30, 40]))
    gc.collect()  # earlier tests' garbage freed now, not while this one counts
    live = len(client8._live_buffers)
    for step in range(1, 4):
        [[out]] = exe.execute([[x, y]], recycle=[[x]])
        assert out is x  # the given-up object wraps the output: no new object, no old one to free
        assert not out.is_deleted
        np.testing.assert_array_equal(out.to_numpy(), [1 + 10 * step, 2 + 20 * step, 3 + 30 * step, 4 + 40 * step])
        assert len(client8._live_buffers) == live  # the donated handle was destroyed, not leaked
    np.testing.assert_array_equal(y.to_numpy(), [10, 20, 30, 40])  # not given up: untouched


def test_recycled_buffers_of_each_device_wrap_that_devices_outputs(client8):
    x = np.arange(16, dtype=np.float32) - 5
    exe = client8.compile(spmd_square_and_sum(8, 16), CompileOptions(num_partitions=8, use_spmd_partitioning=True))
    devices = exe.addressable_devices
    shards = [[client8.buffer_from_host(x[2 * i: 2 * i + 2], device=d)] for i, d in enumerate(devices)]
    spare = [[total] for _, total in exe.execute(shards)]  # 0-d: another shape than the output they will wrap
    outs = exe.execute(shards, recycle=spare)  # given up: not arguments of this call
    for i, (square, total) in enumerate(outs):
        assert square is spare[i][0]  # the device's one spare wraps its first output
        assert square.device is devices[i] and square.shape == (2,)
        np.testing.assert_array_equal(square.to_numpy(), (x * x)[2 * i: 2 * i + 2])
        assert total.shape == () and total.to_numpy() == pytest.approx(float((x * x).sum()))
        np.testing.assert_array_equal(shards[i][0].to_numpy(), x[2 * i: 2 * i + 2])  # arguments untouched


def test_a_given_up_argument_the_program_still_reads_is_recycled_safely(client8):
    """The old handles are destroyed while the program runs (PJRT frees a buffer's memory once the executions
    using it are done): a given-up argument that is not donated is still read whole."""
    x = np.arange(4096, dtype=np.float32) - 2000
    exe = client8.compile(spmd_square_and_sum(8, 4096), CompileOptions(num_partitions=8, use_spmd_partitioning=True))
    devices = exe.addressable_devices
    uploads = [[client8.buffer_from_host(x[512 * i: 512 * (i + 1)], device=d)] for i, d in enumerate(devices)]
    shards = [[square] for square, _ in exe.execute(uploads)]  # computed buffers (uploads are not reused)
    squares = x * x
    outs = exe.execute(shards, recycle=shards)  # each argument given up while the program reads it
    for i, (square, total) in enumerate(outs):
        assert square is shards[i][0]
        np.testing.assert_array_equal(square.to_numpy(), (squares * squares)[512 * i: 512 * (i + 1)])
        assert total.to_numpy() == pytest.approx(float((squares.astype(np.float64) ** 2).sum()), rel=1e-4)


def test_given_up_buffers_not_needed_for_outputs_are_deleted(client8):
    exe = client8.compile(DONATING_ADD)
    x = _computed(client8, _f32([1, 2, 3, 4]))
    y = client8.buffer_from_host(_f32([1, 1, 1, 1]))
    extra = [_computed(client8, _f32([0, 0, 0, 0])), client8.buffer_from_host(_f32([0, 0, 0, 0]))]  # the upload last
    gc.collect()  # earlier tests' garbage freed now, not while this one counts
    live = len(client8._live_buffers)
    [[out]] = exe.execute([[x, y]], recycle=[[x, *extra]])
    np.testing.assert_array_equal(out.to_numpy(), [2, 3, 4, 5])
    given = [x, *extra]
    assert sum(b is out for b in given) == 1 and out is not extra[-1]  # an upload holding host memory: deleted
    assert all(b.is_deleted for b in given if b is not out)
    assert len(client8._live_buffers) == live - 2


@pytest.mark.parametrize("case", ["no wait", "list count", "not a buffer", "twice", "viewed", "other client"])
def test_a_bad_recycle_list_is_refused_before_anything_runs(client8, cpu_library_path, case):
    exe = client8.compile(DONATING_ADD)
    x = client8.buffer_from_host(_f32([1, 2, 3, 4]))
    y = client8.buffer_from_host(_f32([1, 1, 1, 1]))
    z = client8.buffer_from_host(_f32([5, 5, 5, 5]))
    kwargs: dict = {"recycle": [[x]]}
    view = None
    other = None
    if case == "no wait":
        kwargs["wait"] = False
        error, match = ValueError, "wait=True"
    elif case == "list count":
        kwargs["recycle"] = [[x], [z]]
        error, match = ValueError, "one list of buffers per device"
    elif case == "not a buffer":
        kwargs["recycle"] = [[x, "z"]]
        error, match = TypeError, "takes Buffers"
    elif case == "twice":
        kwargs["recycle"] = [[x, z, x]]
        error, match = ValueError, "more than once"
    elif case == "viewed":
        view = z.host_view()
        kwargs["recycle"] = [[x, z]]
        error, match = BufferViewedError, "host view"
    else:
        other = Client(cpu_library_path, {"cpu_device_count": 1}, schema=CPU_OPTION_SCHEMA, plugin_name="cpu")
        kwargs["recycle"] = [[x, other.buffer_from_host(_f32([0, 0, 0, 0]))]]
        error, match = ValueError, "another"
    try:
        with pytest.raises(error, match=match):
            exe.execute([[x, y]], **kwargs)
        np.testing.assert_array_equal(x.to_numpy(), [1, 2, 3, 4])  # nothing ran: not donated, not freed
        np.testing.assert_array_equal(z.to_numpy(), [5, 5, 5, 5])
    finally:
        del view
        if other is not None:
            kwargs.clear()
            other.close()


def test_a_buffer_given_up_while_another_execute_runs_is_deleted_not_reused(client8):
    """Another thread's execute might read a given-up buffer: the call deletes it (freed when unused) instead."""
    busy = client8.compile(busy_loop(200_000_000))
    start = client8.buffer_from_host(np.array(0, np.int64))
    exe = client8.compile(DONATING_ADD)
    x = client8.buffer_from_host(_f32([1, 2, 3, 4]))
    y = client8.buffer_from_host(_f32([1, 1, 1, 1]))
    worker = threading.Thread(target=lambda: busy.execute([[start]]))
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not client8._running and time.monotonic() < deadline:  # the busy execute is in flight
            time.sleep(0.001)
        assert client8._running, "the busy program did not start"
        [[out]] = exe.execute([[x, y]], recycle=[[x]])
        still_running = worker.is_alive()
    finally:
        worker.join()
    assert still_running  # the case this test is about: another call was in flight during the execute
    assert out is not x and x.is_deleted
    np.testing.assert_array_equal(out.to_numpy(), [2, 3, 4, 5])


def test_recycling_without_the_compiled_fast_path(cpu_library_path):
    _run_without_the_fast_path(cpu_library_path, """
        y = client.buffer_from_host(np.ones(4, dtype=np.float32))
        [[x]] = exe.execute([[client.buffer_from_host(np.arange(4, dtype=np.float32) - 1), y]])
        [[extra]] = exe.execute([[client.buffer_from_host(np.zeros(4, dtype=np.float32)), y]])
        for _ in range(3):
            [[out]] = exe.execute([[x, y]], recycle=[[extra, x]])
            assert out is x and extra.is_deleted
        assert out.to_numpy().tolist() == [3, 4, 5, 6]
        assert len(client._live_buffers) == 2  # x and y: every other handle was freed
    """)

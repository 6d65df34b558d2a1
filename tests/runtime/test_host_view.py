"""Buffer.host_view() on the real CPU plugin: zero-copy, read-only, pinned, never readable after a free;
device-memory plugins (the shim, the stub) refuse it and keep the transfer paths."""

from __future__ import annotations

import gc
import weakref

import ml_dtypes
import numpy as np
import pytest
from _support import run_on_threads
from runtime_support import COLUMN_MAJOR_TRANSPOSE, CPU_OPTION_SCHEMA, aligned

from pjrt_plugins.errors import BufferViewedError, HostViewUnavailableError
from pjrt_plugins.runtime import Client, ClientClosedError, PjrtError, new_args


@pytest.fixture
def client(cpu_library_path):
    """A CPU client of its own (these tests close clients and count pins)."""
    with Client(cpu_library_path, {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA, plugin_name="cpu") as c:
        yield c


def _raw_decrease(buf) -> None:
    args = new_args("PJRT_Buffer_DecreaseExternalReferenceCount_Args")
    args.buffer = buf.c_pointer()
    buf.client.library.call("PJRT_Buffer_DecreaseExternalReferenceCount", args)


def _raw_increase(buf) -> None:
    args = new_args("PJRT_Buffer_IncreaseExternalReferenceCount_Args")
    args.buffer = buf.c_pointer()
    buf.client.library.call("PJRT_Buffer_IncreaseExternalReferenceCount", args)


def test_a_view_reads_the_buffers_own_memory_without_a_copy(client):
    data = aligned(1024)
    data[:] = np.arange(1024)
    buf = client.buffer_from_host(data, copy=False)  # the CPU plugin aliases aligned memory
    view = buf.host_view()
    assert view.shape == (1024,) and view.dtype == np.float32
    assert view.ctypes.data == data.ctypes.data  # the very bytes the buffer holds: no copy
    data[7] = -1.0
    assert view[7] == -1.0
    copied = client.buffer_from_host(np.arange(6, dtype=np.int16).reshape(2, 3))
    np.testing.assert_array_equal(copied.host_view(), np.arange(6).reshape(2, 3))


def test_a_view_is_read_only_for_good(client):
    view = client.buffer_from_host(np.ones((4, 4), np.float32)).host_view()
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0, 0] = 2.0
    with pytest.raises(ValueError):
        view.flags.writeable = True


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint64, ml_dtypes.bfloat16, np.complex128])
def test_views_of_every_kind_of_dtype(client, dtype):
    data = (np.arange(12) % 2 if dtype is np.bool_ else np.arange(12)).astype(dtype).reshape(3, 4)
    view = client.buffer_from_host(data).host_view()
    assert view.dtype == np.dtype(dtype) and view.tobytes() == data.tobytes()


def test_a_view_keeps_its_buffer_alive_and_pinned(client):
    data = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    buf = client.buffer_from_host(data)
    alive = weakref.ref(buf)
    column = buf.host_view()[:, 3]  # an array made from the view holds the pin too
    del buf
    gc.collect()
    assert alive() is not None  # garbage collection keeps the viewed buffer
    _raw_decrease(alive())  # the plugin holds our external reference (else this fails)...
    _raw_increase(alive())  # ...put it back
    np.testing.assert_array_equal(column, data[:, 3])
    registered = len(client._live_buffers)
    del column
    gc.collect()
    assert alive() is None  # the last array gone: unpinned and freed
    assert len(client._live_buffers) == registered - 1


def test_dropping_the_views_returns_the_external_reference(client):
    buf = client.buffer_from_host(np.ones(8, np.float32))
    views = [buf.host_view() for _ in range(3)]
    assert all(v[0] == 1.0 for v in views)
    del views
    gc.collect()
    with pytest.raises(PjrtError):  # the plugin's count is back at zero: one decrease per increase
        _raw_decrease(buf)
    buf.delete()
    assert buf.is_deleted


def test_delete_refuses_while_a_view_is_alive(client):
    data = np.arange(16, dtype=np.float32)
    buf = client.buffer_from_host(data)
    view = buf.host_view()
    with pytest.raises(BufferViewedError, match="1 host view"):
        buf.delete()
    with pytest.raises(BufferViewedError):
        with buf:  # the context manager frees too
            pass
    assert not buf.is_deleted  # nothing was freed: the view still reads live memory
    np.testing.assert_array_equal(view, data)
    np.testing.assert_array_equal(buf.to_numpy(), data)
    del view
    buf.delete()
    assert buf.is_deleted
    with pytest.raises(ValueError, match="deleted"):
        buf.host_view()  # no view of freed memory can be made


def test_delete_buffers_refuses_a_batch_holding_a_viewed_buffer_and_frees_none(client, cpu_library_path):
    data = np.arange(16, dtype=np.float32)
    viewed, other = client.buffer_from_host(data), client.buffer_from_host(data)
    view = viewed.host_view()
    with pytest.raises(BufferViewedError, match="1 of them"):
        client.delete_buffers([other, viewed])
    assert not viewed.is_deleted and not other.is_deleted  # checked before any was touched
    np.testing.assert_array_equal(view, data)
    with Client(cpu_library_path, {"cpu_device_count": 1}, schema=CPU_OPTION_SCHEMA) as stranger:
        foreign = stranger.buffer_from_host(data)
        with pytest.raises(ValueError, match="another"):
            client.delete_buffers([other, foreign])
        assert not other.is_deleted and not foreign.is_deleted
    with pytest.raises(TypeError, match="ndarray"):
        client.delete_buffers([other, data])
    del view
    client.delete_buffers([other, viewed])
    assert viewed.is_deleted and other.is_deleted


def test_close_refuses_while_a_view_is_alive(cpu_library_path):
    client = Client(cpu_library_path, {"cpu_device_count": 1}, schema=CPU_OPTION_SCHEMA)
    data = np.arange(10, dtype=np.int32)
    view = client.buffer_from_host(data).host_view()
    with pytest.raises(BufferViewedError, match="cannot close"):
        client.close()
    assert not client.closed  # still fully usable
    np.testing.assert_array_equal(client.buffer_from_host(data).to_numpy(), data)
    np.testing.assert_array_equal(view, data)
    del view
    client.close()
    assert client.closed
    with pytest.raises(ClientClosedError):
        client.buffer_from_host(data)


def test_views_wait_for_computed_data_and_undo_permuted_layouts(client):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = client.buffer_from_host(data)
    [[column_major]] = client.compile(COLUMN_MAJOR_TRANSPOSE).execute([[buf]], wait=False)
    view = column_major.host_view()
    assert view.shape == (3, 2) and not view.flags.c_contiguous  # a transposed look at the raw bytes
    np.testing.assert_array_equal(view, data.T)


def test_empty_buffers_give_empty_views_and_no_pin(client):
    buf = client.buffer_from_host(np.zeros((0, 3), np.float32))
    view = buf.host_view()
    assert view.shape == (0, 3) and not view.flags.writeable
    buf.delete()  # nothing to pin


def test_strided_out_regions_are_filled_and_the_rest_untouched(client):
    torch = pytest.importorskip("torch")
    data = np.random.default_rng(1).standard_normal((300, 40)).astype(np.float32)
    buf = client.buffer_from_host(data)
    target = np.zeros((300, 120), np.float32)
    assert buf.to_numpy(out=target[:, 40:80]) is not None
    np.testing.assert_array_equal(target[:, 40:80], data)
    assert not target[:, :40].any() and not target[:, 80:].any()
    halves = torch.zeros(6, 8, dtype=torch.bfloat16)
    src = torch.arange(24, dtype=torch.bfloat16).reshape(6, 4)
    client.buffer_from_host(src).to_torch(out=halves[:, 4:])
    assert torch.equal(halves[:, 4:], src) and not halves[:, :4].any()
    with pytest.raises(ValueError, match="writeable array of shape"):
        buf.to_numpy(out=np.zeros((40, 300), np.float32))
    with pytest.raises(ValueError, match="writeable array of shape"):
        buf.to_numpy(out=np.zeros((300, 40), np.float64))


def test_views_from_many_threads(client):
    data = np.arange(4096, dtype=np.float64)
    buf = client.buffer_from_host(data)

    def read(seed: int) -> None:
        for _ in range(200):
            view = buf.host_view()
            assert view[seed] == seed and view[-1] == 4095.0

    run_on_threads(read, [(i,) for i in range(4)])
    gc.collect()
    buf.delete()  # every pin was returned
    assert buf.is_deleted


def test_device_memory_plugins_refuse_views_and_keep_the_transfer_path(build_shim):
    with Client(build_shim(SHIM_NOT_ON_CPU=True)) as client:
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        buf = client.buffer_from_host(data)
        assert not buf.host_readable()
        with pytest.raises(HostViewUnavailableError, match="to_numpy"):
            buf.host_view()
        target = np.zeros((3, 8), np.float32)
        buf.to_numpy(out=target[:, 2:6])  # strided: through a temporary array
        np.testing.assert_array_equal(target[:, 2:6], data)
        assert not target[:, :2].any() and not target[:, 6:].any()


def test_the_stub_plugin_refuses_views(stub_library):
    path = stub_library
    with Client(path, {"num_devices": 2}, schema={"num_devices": int}) as client:
        data = np.arange(6, dtype=np.int32).reshape(3, 2)
        buf = client.buffer_from_host(data, device=client.devices[1])
        assert not buf.host_readable()
        with pytest.raises(HostViewUnavailableError):
            buf.host_view()
        target = np.zeros((3, 4), np.int32)
        buf.to_numpy(out=target[:, 1:3])
        np.testing.assert_array_equal(target[:, 1:3], data)


def test_a_view_alive_at_exit_does_not_crash_the_process(python_subprocess, cpu_library_path):
    code = (
        "import logging, numpy as np\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from pjrt_plugins.runtime import Client\n"
        f"c = Client({str(cpu_library_path)!r}, {{'cpu_device_count': 2}})\n"
        "VIEW = c.buffer_from_host(np.arange(1 << 20, dtype=np.float32)).host_view()\n"
        "print(float(VIEW[-1]))\n"
    )
    result = python_subprocess(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(float((1 << 20) - 1))
    assert "not closing a client at exit" in result.stderr  # its memory outlived the interpreter's views

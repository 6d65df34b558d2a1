"""Buffers on the real CPU plugin: every dtype both ways, numpy and torch, layouts, lifetime."""

from __future__ import annotations

import gc
import weakref

import ml_dtypes
import numpy as np
import pytest
from runtime_support import COLUMN_MAJOR_TRANSPOSE, aligned

from pjrt_plugins.runtime import Buffer

NUMPY_DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    ml_dtypes.bfloat16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e4m3fn,
]


def sample(dtype, shape=(3, 5), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return (rng.standard_normal(shape) * 4).astype(dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_round_trip(client8, dtype):
    data = sample(dtype)
    buf = client8.buffer_from_host(data, device=client8.devices[1])
    assert buf.dtype == np.dtype(dtype)
    assert buf.shape == data.shape
    assert buf.device is client8.devices[1]
    out = buf.to_numpy()
    assert same_bits(out, data)
    assert np.asarray(buf).dtype == np.dtype(dtype)


TORCH_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "float8_e5m2",
    "float8_e4m3fn",
]


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_round_trip(client8, name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, name)
    generator = torch.Generator().manual_seed(0)
    if name == "bool":
        tensor = torch.randint(0, 2, (4, 6), generator=generator).bool()
    elif name.startswith(("int", "uint")):
        tensor = torch.randint(-100 if name.startswith("int") else 0, 100, (4, 6), generator=generator).to(dtype)
    else:
        tensor = (torch.randn(4, 6, generator=generator) * 3).to(dtype)
    buf = client8.buffer_from_host(tensor)
    assert buf.shape == (4, 6)
    back = buf.to_torch()
    assert isinstance(back, torch.Tensor) and back.dtype == dtype and back.device.type == "cpu"
    if tensor.element_size() == 1:  # compare bits: fp8 has no torch.equal
        assert torch.equal(back.view(torch.uint8), tensor.view(torch.uint8))
    else:
        assert torch.equal(back, tensor)


def test_torch_tensor_that_requires_grad_and_non_contiguous_views(client8):
    torch = pytest.importorskip("torch")
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6).requires_grad_()
    for view in (base, base.T, base[:, ::2], base.flip(0), base.T[1:3]):
        buf = client8.buffer_from_host(view)
        assert torch.equal(buf.to_torch(), view.detach().contiguous())
    bf16 = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4).T
    assert torch.equal(client8.buffer_from_host(bf16).to_torch(), bf16.contiguous())


def test_torch_is_not_imported_for_numpy_work(python_subprocess, cpu_library_path):
    code = (
        "import sys, numpy as np\n"
        "from pjrt_plugins.runtime import Client\n"
        f"c = Client({str(cpu_library_path)!r})\n"
        "c.buffer_from_host(np.ones(3)).to_numpy()\n"
        "print('torch' in sys.modules)\n"
    )
    result = python_subprocess(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a.T,
        lambda a: a[:, ::2],
        lambda a: a[::-1, ::-3],
        lambda a: a[1:3, 2:5],
        lambda a: np.broadcast_to(a[:1], (4, 6)),
        lambda a: a.astype(">i4"),
    ],
    ids=["transposed", "strided", "negative-strides", "sliced", "broadcast", "big-endian"],
)
def test_non_contiguous_and_foreign_layouts(client8, make):
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    view = make(base)
    out = client8.buffer_from_host(view).to_numpy()
    np.testing.assert_array_equal(out, view)
    assert out.dtype == np.int32 and out.flags.c_contiguous


def test_scalars_empty_arrays_and_lists(client8):
    scalar = client8.buffer_from_host(np.float32(2.5))
    assert scalar.shape == () and scalar.to_numpy() == np.float32(2.5)
    empty = client8.buffer_from_host(np.zeros((0, 3), np.float64))
    assert empty.shape == (0, 3) and empty.to_numpy().shape == (0, 3)
    listed = client8.buffer_from_host([[1, 2], [3, 4]])
    np.testing.assert_array_equal(listed.to_numpy(), [[1, 2], [3, 4]])


def test_unsupported_values(client8):
    with pytest.raises(NotImplementedError, match="dtype <U"):
        client8.buffer_from_host(np.array(["a", "b"]))
    with pytest.raises(TypeError, match="not an array"):
        client8.buffer_from_host(object())
    with pytest.raises(TypeError, match="device must be"):
        client8.buffer_from_host(np.ones(2), device="cpu:0")


def test_facts(client8):
    data = np.ones((8, 16), np.float32)
    buf = client8.buffer_from_host(data, device=5)
    assert buf.device is client8.devices[5]
    assert buf.memory.kind == "device"
    assert (buf.ndim, buf.size, buf.nbytes) == (2, 128, 512)
    assert buf.on_device_size >= 512
    assert buf.block_until_ready() is buf
    assert buf.is_ready
    assert not buf.is_deleted
    assert "shape=(8, 16)" in repr(buf)


def test_delete_and_context_manager(client8):
    with client8.buffer_from_host(np.ones(3)) as buf:
        assert not buf.is_deleted
    assert buf.is_deleted
    with pytest.raises(ValueError, match="deleted"):
        buf.to_numpy()
    buf.delete()  # twice is fine
    assert "deleted" in repr(buf)


def test_copy_to_device(client8):
    data = np.arange(10, dtype=np.int64)
    src = client8.buffer_from_host(data, device=0)
    dst = src.copy_to_device(client8.devices[6])
    assert dst.device.id == 6
    np.testing.assert_array_equal(dst.to_numpy(), data)


@pytest.mark.parametrize("nbytes", [1, 63, 64, 4096 + 3, 1 << 21])
def test_aligned_empty_starts_on_the_host_alignment(nbytes):
    from pjrt_plugins.runtime import HOST_ALIGNMENT, aligned_empty

    data = aligned_empty(nbytes)
    assert data.dtype == np.uint8 and data.shape == (nbytes,)
    assert data.ctypes.data % HOST_ALIGNMENT == 0
    data[:] = 7  # the whole span is writable memory of its own
    assert int(data.sum()) == 7 * nbytes


def test_zero_copy_aliases_host_memory_and_default_copies(client8):
    # The CPU plugin aliases 64-byte-aligned host memory under kImmutableZeroCopy.
    data = aligned(256)
    data[:] = 1
    shared = client8.buffer_from_host(data, copy=False)
    copied = client8.buffer_from_host(data)
    data[0] = 42
    assert shared.to_numpy()[0] == 42  # zero-copy: the plugin reads our memory
    assert copied.to_numpy()[0] == 1  # default: the plugin took its own copy


def test_host_memory_lives_until_the_plugin_is_done_with_it(client8):
    data = aligned(1024)
    data[:] = np.arange(1024)
    owner = weakref.ref(data.base)
    buf = client8.buffer_from_host(data, copy=False)
    del data
    gc.collect()
    assert owner() is not None  # the buffer still reads it
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(1024, dtype=np.float32))
    buf.delete()
    gc.collect()
    assert owner() is None  # released once the plugin's done-with-host-buffer event fired


def test_buffers_are_instances_with_slots(client8):
    buf = client8.buffer_from_host(np.ones(1))
    assert isinstance(buf, Buffer)
    with pytest.raises(AttributeError):
        buf.anything = 1  # type: ignore[attr-defined]


def test_small_host_buffers_are_read_in_place_and_others_transferred(client8):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    row_major = client8.buffer_from_host(data)
    assert row_major.host_readable()  # the CPU plugin keeps dense row-major data in host memory
    np.testing.assert_array_equal(row_major.to_numpy(), data)
    # An output the compiler lays out column-major must not be read byte for byte.
    [[column_major]] = client8.compile(COLUMN_MAJOR_TRANSPOSE).execute([[row_major]])
    assert column_major.read_plan().order == (1, 0)  # column-major on the device
    np.testing.assert_array_equal(column_major.to_numpy(), data.T)
    big = np.random.default_rng(1).standard_normal(1 << 17).astype(np.float32)  # 512 KiB: transfer path
    np.testing.assert_array_equal(client8.buffer_from_host(big).to_numpy(), big)


def test_to_numpy_into_a_given_array(client8):
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    buf = client8.buffer_from_host(data)
    target = np.zeros((2, 3, 4), np.int32)
    assert buf.to_numpy(out=target[1]) is not None
    np.testing.assert_array_equal(target[1], data)
    assert not target[0].any()
    with pytest.raises(ValueError, match="writeable array of shape"):
        buf.to_numpy(out=np.zeros((4, 3), np.int32))
    with pytest.raises(ValueError, match="writeable array of shape"):
        read_only = np.zeros((3, 4), np.int32)
        read_only.flags.writeable = False
        buf.to_numpy(out=read_only)



def test_to_torch_into_a_given_tensor(client8):
    torch = pytest.importorskip("torch")
    data = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    buf = client8.buffer_from_host(data)
    target = torch.zeros(2, 3, 4, dtype=torch.bfloat16)
    assert buf.to_torch(out=target[1]) is not None
    assert torch.equal(target[1], data) and not target[0].any()
    with pytest.raises(ValueError, match="writeable array of shape"):
        buf.to_torch(out=torch.zeros(4, 3, dtype=torch.bfloat16))

def test_device_memory_buffers_use_the_transfer_paths(build_shim):
    # Through a plugin whose buffers are not in host memory, row-major data takes
    # PJRT_Buffer_ToHostBuffer and a column-major output PJRT_Buffer_CopyRawToHost.
    from pjrt_plugins.runtime import Client

    with Client(build_shim(SHIM_NOT_ON_CPU=True)) as client:
        data = np.arange(6, dtype=np.float32).reshape(2, 3)
        buf = client.buffer_from_host(data)
        assert buf.read_plan().mode == "transfer"
        np.testing.assert_array_equal(buf.to_numpy(), data)
        [[column_major]] = client.compile(COLUMN_MAJOR_TRANSPOSE).execute([[buf]])
        assert column_major.read_plan() == ("raw", (1, 0))
        np.testing.assert_array_equal(column_major.to_numpy(), data.T)

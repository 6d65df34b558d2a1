"""Compile and execute on the real CPU plugin: formats, facts, serialization, SPMD, errors."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_support import (
    ADD_F32_4,
    CPU_OPTION_SCHEMA,
    MULTI_OUTPUT,
    identity,
    spmd_square_and_sum,
    to_bytecode,
    to_portable_artifact,
)

from pjrt_plugins.runtime import Client, CompileOptions, Executable, PjrtError


@pytest.fixture(scope="module")
def add(client8) -> Executable:
    return client8.compile(ADD_F32_4)


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def test_add_program(client8, add):
    x = client8.buffer_from_host(f32([1, 2, 3, 4]))
    y = client8.buffer_from_host(f32([10, 20, 30, 40]))
    [[out]] = add.execute([[x, y]])
    np.testing.assert_array_equal(out.to_numpy(), [11, 22, 33, 44])
    assert out.device is client8.devices[0]
    assert (out.shape, out.dtype) == ((4,), np.float32)


def test_executable_facts(client8, add):
    assert add.name == "conform_add"  # the name of the StableHLO module
    assert add.num_outputs == 1
    assert add.output_shapes == [(4,)]
    assert add.output_dtypes == [np.dtype(np.float32)]
    assert add.parameters == [((4,), np.dtype(np.float32))] * 2
    assert (add.num_replicas, add.num_partitions) == (1, 1)
    assert add.addressable_devices == [client8.devices[0]]
    fingerprint = add.fingerprint
    assert fingerprint is None or (isinstance(fingerprint, str) and fingerprint)
    assert add.cost_analysis().get("flops") == 4.0
    assert "HloModule conform_add" in add.optimized_hlo_text()
    assert "outputs=1" in repr(add)


def test_identical_programs_share_a_fingerprint(client8, add):
    if add.fingerprint is None:
        pytest.skip("this plugin offers no executable fingerprint")
    assert client8.compile(ADD_F32_4).fingerprint == add.fingerprint
    assert client8.compile(MULTI_OUTPUT).fingerprint != add.fingerprint


def test_multi_output_program(client8):
    exe = client8.compile(MULTI_OUTPUT)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 1.5, np.float32)
    outs = exe.execute([[client8.buffer_from_host(a), client8.buffer_from_host(b)]])[0]
    assert exe.num_outputs == len(outs) == 4
    assert exe.output_shapes == [(2, 3), (2, 3), (), (2, 3)]
    assert exe.output_dtypes == [np.dtype(np.float32)] * 3 + [np.dtype(np.int32)]
    np.testing.assert_array_equal(outs[0].to_numpy(), a + b)
    np.testing.assert_array_equal(outs[1].to_numpy(), a * b)
    assert outs[2].to_numpy() == pytest.approx((a + b).sum())
    np.testing.assert_array_equal(outs[3].to_numpy(), (a * b).astype(np.int32))


@pytest.mark.parametrize("encoding", ["text", "bytecode", "portable-artifact"])
def test_program_encodings(client8, encoding):
    pytest.importorskip("jaxlib")
    if encoding == "text":
        program = ADD_F32_4
    elif encoding == "bytecode":
        program = to_bytecode(ADD_F32_4)
        assert program[:4] == b"ML\xefR"
    else:
        current = client8.library.attributes["stablehlo_current_version"]
        program = to_portable_artifact(ADD_F32_4, ".".join(map(str, current)))
    exe = client8.compile(program)
    x = client8.buffer_from_host(f32([1, 1, 1, 1]))
    np.testing.assert_array_equal(exe.execute([[x, x]])[0][0].to_numpy(), [2, 2, 2, 2])


def test_compile_errors(client8):
    with pytest.raises(PjrtError) as info:
        client8.compile("module { this is not stablehlo }")
    assert info.value.function == "PJRT_Client_Compile" and info.value.message  # the parser's own text
    with pytest.raises(ValueError, match="empty"):
        client8.compile("")
    with pytest.raises(TypeError, match="str or bytes"):
        client8.compile(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="CompileOptions"):
        client8.compile(ADD_F32_4, {"num_partitions": 2})  # type: ignore[arg-type]


def test_compile_accepts_jaxlib_compile_options_bytes(client8):
    xla_client = pytest.importorskip("jaxlib.xla_client")
    exe = client8.compile(ADD_F32_4, xla_client.CompileOptions().SerializeAsString())
    x = client8.buffer_from_host(f32([2, 2, 2, 2]))
    np.testing.assert_array_equal(exe.execute([[x, x]])[0][0].to_numpy(), [4, 4, 4, 4])


def test_serialize_and_deserialize(client8, add):
    data = add.serialize()
    assert isinstance(data, bytes) and data
    loaded = client8.deserialize_executable(data)
    x = client8.buffer_from_host(f32([1, 2, 3, 4]))
    np.testing.assert_array_equal(loaded.execute([[x, x]])[0][0].to_numpy(), [2, 4, 6, 8])
    assert loaded.output_shapes == add.output_shapes
    with pytest.raises(PjrtError):
        client8.deserialize_executable(b"not an executable")


def test_device_assignment_places_the_program(client8):
    exe = client8.compile(ADD_F32_4, CompileOptions(device_assignment=[[5]]))
    assert exe.addressable_devices == [client8.devices[5]]
    x = client8.buffer_from_host(f32([1, 2, 3, 4]), device=5)
    [[out]] = exe.execute([[x, x]])
    assert out.device.id == 5
    np.testing.assert_array_equal(out.to_numpy(), [2, 4, 6, 8])


def test_portable_executable_runs_on_a_chosen_device(client8):
    exe = client8.compile(ADD_F32_4, CompileOptions(compile_portable_executable=True))
    x = client8.buffer_from_host(f32([1, 2, 3, 4]), device=3)
    [[out]] = exe.execute([[x, x]], device=client8.devices[3])
    assert out.device.id == 3
    np.testing.assert_array_equal(out.to_numpy(), [2, 4, 6, 8])


def test_replicated_program_runs_one_argument_list_per_device(client8):
    program = ADD_F32_4.replace("module @conform_add", "module @conform_add attributes {mhlo.num_replicas = 2 : i32}")
    assert program != ADD_F32_4
    exe = client8.compile(program, CompileOptions(num_replicas=2))
    devices = exe.addressable_devices
    assert exe.num_replicas == 2 and len(devices) == 2
    inputs = [client8.buffer_from_host(f32([i] * 4), device=d) for i, d in enumerate(devices, start=1)]
    outs = exe.execute([[b, b] for b in inputs])
    assert [row[0].device for row in outs] == devices
    assert [row[0].to_numpy().tolist() for row in outs] == [[2.0] * 4, [4.0] * 4]


def test_spmd_program_over_8_devices(client8):
    x = np.arange(16, dtype=np.float32) - 5
    exe = client8.compile(spmd_square_and_sum(8, 16), CompileOptions(num_partitions=8, use_spmd_partitioning=True))
    devices = exe.addressable_devices
    assert exe.num_partitions == 8 and [d.id for d in devices] == list(range(8))
    assert exe.output_shapes == [(2,), ()]
    shards = [[client8.buffer_from_host(x[2 * i : 2 * i + 2], device=d)] for i, d in enumerate(devices)]
    outs = exe.execute(shards)
    assert len(outs) == 8 and all(len(row) == 2 for row in outs)
    for i, (square, total) in enumerate(outs):
        assert square.device is devices[i]
        np.testing.assert_array_equal(square.to_numpy(), (x * x)[2 * i : 2 * i + 2])
        assert total.to_numpy() == pytest.approx(float((x * x).sum()))
    gathered = np.concatenate([row[0].to_numpy() for row in outs])
    np.testing.assert_array_equal(gathered, x * x)


def test_spmd_program_needs_enough_devices(cpu_library_path):
    with Client(cpu_library_path, {"cpu_device_count": 4}, schema=CPU_OPTION_SCHEMA) as small:
        with pytest.raises(ValueError, match="8 devices, but the client on .* has 4"):
            small.compile(spmd_square_and_sum(8, 16), CompileOptions(num_partitions=8, use_spmd_partitioning=True))


def test_execute_without_waiting(client8, add):
    x = client8.buffer_from_host(f32([1, 2, 3, 4]))
    [[out]] = add.execute([[x, x]], wait=False)
    np.testing.assert_array_equal(out.block_until_ready().to_numpy(), [2, 4, 6, 8])


def test_execution_errors_are_exceptions(client8, add):
    x = client8.buffer_from_host(f32([1, 2, 3, 4]))
    add.execute([[x, x]])  # a pooled frame of this shape exists now: it must not skip a check
    with pytest.raises(ValueError, match="takes 2 argument"):
        add.execute([[x]])
    with pytest.raises(TypeError, match="expects float32\\[4\\]"):
        add.execute([[x, client8.buffer_from_host(np.ones(4, np.int32))]])  # same bytes, wrong dtype
    with pytest.raises(TypeError, match="float32\\[3\\]"):
        add.execute([[x, client8.buffer_from_host(np.ones(3, np.float32))]])
    with pytest.raises(TypeError, match="one argument list per device"):
        add.execute([x, x])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not a Buffer"):
        add.execute([[x, np.ones(4, np.float32)]])  # type: ignore[list-item]
    gone = client8.buffer_from_host(f32([0, 0, 0, 0]))
    gone.delete()
    with pytest.raises(ValueError, match="deleted"):
        add.execute([[x, gone]])
    with pytest.raises(ValueError, match="same number of arguments"):
        add.execute([[x, x], [x]])
    with pytest.raises(ValueError, match="another client"):
        with Client(client8.library) as other:
            add.execute([[x, other.buffer_from_host(f32([1, 2, 3, 4]))]])
    [[out]] = add.execute([[x, x]])  # the frames given back after each failure still work
    np.testing.assert_array_equal(out.to_numpy(), [2, 4, 6, 8])


def test_plugin_side_execution_error(client8, add):
    # A buffer on the wrong device gets past our checks; the plugin refuses it.
    elsewhere = client8.buffer_from_host(f32([1, 2, 3, 4]), device=2)
    with pytest.raises(PjrtError) as info:
        add.execute([[elsewhere, elsewhere]])
    assert info.value.code_name == "INVALID_ARGUMENT"
    assert info.value.function == "PJRT_LoadedExecutable_Execute"


def test_buffers_of_another_client_are_refused(cpu_library_path, add):
    with Client(cpu_library_path) as other:
        foreign = other.buffer_from_host(f32([1, 2, 3, 4]))
        with pytest.raises(ValueError, match="another client"):
            add.execute([[foreign, foreign]])


def test_delete_and_context_manager(client8):
    with client8.compile(identity("tensor<2xi64>")) as exe:
        x = client8.buffer_from_host(np.array([7, 8]))
        np.testing.assert_array_equal(exe.execute([[x]])[0][0].to_numpy(), [7, 8])
    assert exe.is_deleted
    with pytest.raises(ValueError, match="deleted"):
        exe.execute([[x]])
    exe.delete()
    assert "deleted" in repr(exe)


@pytest.mark.parametrize(
    "mlir, dtype", [("tensor<3xbf16>", "bfloat16"), ("tensor<3xi1>", "bool"), ("tensor<3xui16>", "uint16")]
)
def test_identity_programs_keep_dtypes(client8, mlir, dtype):
    import ml_dtypes

    np_dtype = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    data = np.array([1, 0, 1]).astype(np_dtype)
    exe = client8.compile(identity(mlir))
    assert exe.parameters == [((3,), np_dtype)]
    [[out]] = exe.execute([[client8.buffer_from_host(data)]])
    assert out.dtype == np_dtype
    np.testing.assert_array_equal(out.to_numpy(), data)


def test_compile_a_serialized_hlo_module(client8, add):
    fmt, _ = add.optimized_program()
    assert fmt in ("hlo", "hlo_with_config")
    module = add.optimized_hlo_module()  # the HloModuleProto, unwrapped from hlo_with_config
    exe = client8.compile(module, format="hlo")
    x = client8.buffer_from_host(f32([1, 2, 3, 4]))
    np.testing.assert_array_equal(exe.execute([[x, x]])[0][0].to_numpy(), [2, 4, 6, 8])

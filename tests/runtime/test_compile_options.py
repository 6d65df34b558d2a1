"""Our hand-encoded CompileOptionsProto, read back by jaxlib's own parser."""

from __future__ import annotations

import pytest

from pjrt_plugins.runtime import CompileOptions
from pjrt_plugins.runtime._proto import length_delimited_fields, varint, varint_fields

xla_client = pytest.importorskip("jaxlib.xla_client")


def parse(options: CompileOptions):
    return xla_client.CompileOptions.ParseFromString(options.serialize())


def test_defaults():
    parsed = parse(CompileOptions())
    assert (parsed.num_replicas, parsed.num_partitions) == (1, 1)
    assert not parsed.executable_build_options.use_spmd_partitioning
    assert not parsed.compile_portable_executable


@pytest.mark.parametrize("replicas, partitions, spmd", [(1, 8, True), (4, 1, False), (2, 4, True), (3, 5, False)])
def test_replicas_partitions_spmd(replicas, partitions, spmd):
    parsed = parse(CompileOptions(num_replicas=replicas, num_partitions=partitions, use_spmd_partitioning=spmd))
    assert (parsed.num_replicas, parsed.num_partitions) == (replicas, partitions)
    assert parsed.executable_build_options.use_spmd_partitioning is spmd


def test_device_assignment_is_replica_by_partition():
    grid = [[0, 1, 2, 3], [4, 5, 6, 7]]
    parsed = parse(CompileOptions(num_replicas=2, num_partitions=4, device_assignment=grid))
    assignment = parsed.device_assignment
    assert (assignment.replica_count(), assignment.computation_count()) == (2, 4)
    # jaxlib builds the same proto from the same [replica][partition] grid.
    reference = xla_client.CompileOptions()
    reference.num_replicas, reference.num_partitions = 2, 4
    import numpy as np

    reference.device_assignment = xla_client.DeviceAssignment.create(np.array(grid))
    expected = xla_client.CompileOptions.ParseFromString(reference.SerializeAsString()).device_assignment
    assert str(assignment) == str(expected)


def test_portable_executable_flag():
    assert parse(CompileOptions(compile_portable_executable=True)).compile_portable_executable


def test_device_ordinal_is_minus_one_as_int64():
    data = CompileOptions().serialize()
    [build] = length_delimited_fields(data, 3)
    assert varint_fields(build, 1) == [(1 << 64) - 1]  # -1, two's complement
    assert varint(-1) == b"\xff" * 9 + b"\x01"
    assert len(CompileOptions(num_partitions=8, use_spmd_partitioning=True).serialize()) == 19


def test_truncated_messages_raise_for_either_reader():
    data = CompileOptions(num_partitions=8).serialize()
    for cut in (data[:-1], data[:2], b"\x12\x05\x01", b"\x09\x00"):
        with pytest.raises(ValueError, match="truncated"):
            length_delimited_fields(cut, 3)
        with pytest.raises(ValueError, match="truncated"):
            varint_fields(cut, 1)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"num_replicas": 0}, ValueError),
        ({"num_partitions": True}, ValueError),
        ({"num_partitions": 2, "device_assignment": [[0]]}, ValueError),
        ({"num_replicas": 2, "device_assignment": [[0], [0]]}, ValueError),
        ({"device_assignment": [[-1]]}, ValueError),
        ({"device_assignment": [5]}, TypeError),
        ({"num_replicas": 2**32}, ValueError),  # the CPU plugin aborts on it
        ({"num_partitions": 2**31}, ValueError),
        ({"num_replicas": 2**16, "num_partitions": 2**16}, ValueError),  # fits alone, not together
        ({"device_assignment": [[2**31]]}, ValueError),
    ],
)
def test_invalid_options(kwargs, error):
    with pytest.raises(error):
        CompileOptions(**kwargs)


def test_compile_options_beyond_the_clients_devices_never_reach_the_plugin(cpu_library_path, python_subprocess):
    """Today's CPU plugin aborts (or runs out of memory) on replica and partition counts it cannot have."""
    code = f"""
from pjrt_plugins.runtime import Client, CompileOptions
from pjrt_plugins.conform._programs import ADD_F32
client = Client({str(cpu_library_path)!r}, {{"cpu_device_count": 1}}, schema={{"cpu_device_count": int}})
for make in (lambda: CompileOptions(num_replicas=2**32), lambda: CompileOptions(num_replicas=65536, num_partitions=32768),
             lambda: CompileOptions(num_partitions=2), lambda: CompileOptions(device_assignment=[[3]])):
    try:
        client.compile(ADD_F32, make())
    except ValueError as exc:
        print("refused:", exc)
print("alive")
"""
    result = python_subprocess(code)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[-1] == "alive" and len([line for line in lines if line.startswith("refused:")]) == 4, result.stdout
    assert "must be an integer from 1 to 2147483647" in lines[0]
    assert "need 1 replica(s) x 2 partition(s) = 2 devices, but the client" in result.stdout
    assert "names device ids [3] that the client" in result.stdout


def test_options_are_frozen_and_hashable():
    options = CompileOptions(num_partitions=2, device_assignment=[[3, 1]])
    assert options.device_assignment == ((3, 1),)
    assert hash(options) == hash(CompileOptions(num_partitions=2, device_assignment=[(3, 1)]))
    with pytest.raises(AttributeError):
        options.num_partitions = 4  # type: ignore[misc]


def test_sharding_propagation_flags():
    parsed = parse(
        CompileOptions(
            num_partitions=2,
            use_spmd_partitioning=True,
            allow_spmd_sharding_propagation_to_output=True,
            allow_spmd_sharding_propagation_to_parameters=[False, True],
        )
    )
    build = parsed.executable_build_options
    assert list(build.allow_spmd_sharding_propagation_to_output) == [True]
    assert list(build.allow_spmd_sharding_propagation_to_parameters) == [False, True]
    assert list(parse(CompileOptions()).executable_build_options.allow_spmd_sharding_propagation_to_output) == []
    with pytest.raises(TypeError):
        CompileOptions(allow_spmd_sharding_propagation_to_output=[1])  # type: ignore[list-item]

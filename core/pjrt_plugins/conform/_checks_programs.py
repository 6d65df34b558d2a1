"""Checks of programs: compile, the executable's facts, execution on one device, several outputs,
serialization, replicated and SPMD execution over every device; then the client's close.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import UnsupportedFunctionError
from ..runtime import SHARDY_PROBE_PROGRAM, Buffer, Client, CompileOptions, Device, shardy_refusal
from ._checks_buffers import one_device_reason
from ._context import Context
from ._framework import Fail, Skip, Unsupported, check
from ._programs import ADD_F32, TWO_OUTPUTS, spmd_square_and_sum


def _several_devices(ctx: Context) -> tuple[Client, int]:
    """The client and its device count, for checks that need at least two devices (else they skip)."""
    client = ctx.client
    count = len(client.addressable_devices)
    if count < 2:
        raise Skip(one_device_reason(ctx))
    return client, count


def _two_per_device(client: Client, x: np.ndarray, devices: list[Device]) -> list[list[Buffer]]:
    """Execute arguments giving device ``i`` the shard ``x[2i:2i+2]`` (the partitioned programs' layout)."""
    return [[client.buffer_from_host(x[2 * i : 2 * i + 2], d)] for i, d in enumerate(devices)]


@check("compile.program", "a StableHLO program compiles", requires=("client.create",))
def check_compile(ctx: Context) -> str:
    started = time.monotonic()
    executable = ctx.executable
    return f"f32[4] add compiled in {time.monotonic() - started:.2f} s ({executable.num_outputs} output)"


@check("compile.properties", "the executable reports its outputs, replicas, partitions and devices",
       requires=("compile.program",))
def check_compile_properties(ctx: Context) -> str:
    executable = ctx.executable
    facts, unsupported = [], []
    expectations = (
        ("num_outputs", 1),
        ("num_replicas", 1),
        ("num_partitions", 1),
        ("output_shapes", [(4,)]),
        ("output_dtypes", [np.dtype(np.float32)]),
    )
    for name, expected in expectations:
        try:
            value = getattr(executable, name)
        except (UnsupportedFunctionError, NotImplementedError):
            unsupported.append(name)
            continue
        if value != expected:
            raise Fail(f"{name} is {value!r}, expected {expected!r}")
        facts.append(name)
    try:
        if not executable.addressable_devices:
            raise Fail("the executable has no addressable devices")
    except (UnsupportedFunctionError, NotImplementedError):
        unsupported.append("addressable_devices")
    missing = f"; not offered: {', '.join(unsupported)}" if unsupported else ""
    return f"{', '.join(facts)} correct{missing}"


@check("execute.single", "a compiled program runs on one device and gives the right answer",
       requires=("compile.program",))
def check_execute_single(ctx: Context) -> str:
    client = ctx.client
    device = client.addressable_devices[0]
    a = np.array([1.5, -2.0, 3.25, 0.0], dtype=np.float32)
    b = np.array([0.5, 4.0, -1.25, 8.0], dtype=np.float32)
    outputs = ctx.executable.execute([[client.buffer_from_host(a, device), client.buffer_from_host(b, device)]])
    if len(outputs) != 1 or len(outputs[0]) != 1:
        raise Fail(f"expected 1 device x 1 output, got {[len(o) for o in outputs]}")
    result = outputs[0][0].to_numpy()
    if not np.array_equal(result, a + b):
        raise Fail(f"{a} + {b} gave {result}")
    return f"{a.tolist()} + {b.tolist()} = {result.tolist()}"


@check("execute.outputs", "several outputs of different dtypes and ranks come back right",
       requires=("execute.single",))
def check_execute_outputs(ctx: Context) -> str:
    client = ctx.client
    executable = client.compile(TWO_OUTPUTS)
    x = np.array([[1, -2, 3], [4, 5, -6]], dtype=np.int32)
    (doubled, total), = executable.execute([[client.buffer_from_host(x)]])
    got = doubled.to_numpy(), total.to_numpy()
    if not (np.array_equal(got[0], x * 2) and got[1].shape == () and int(got[1]) == int(x.sum())):
        raise Fail(f"got {got[0].tolist()} and {got[1]!r}; expected {(x * 2).tolist()} and {int(x.sum())}")
    return "i32[2,3] and i32[] outputs correct"


@check("compile.serialize", "an executable serializes and loads back", requires=("execute.single",))
def check_serialize(ctx: Context) -> str:
    client = ctx.client
    for name in ("PJRT_Executable_Serialize", "PJRT_Executable_DeserializeAndLoad"):
        if not client.library.has_function(name):
            raise Unsupported(f"{name} is not provided")
    data = ctx.executable.serialize()
    if not data:
        raise Fail("PJRT_Executable_Serialize returned no bytes")
    loaded = client.deserialize_executable(data)
    a = np.arange(4, dtype=np.float32)
    result = loaded.execute([[client.buffer_from_host(a), client.buffer_from_host(a)]])[0][0].to_numpy()
    if not np.array_equal(result, a + a):
        raise Fail(f"the reloaded executable computed {result}, expected {a + a}")
    return f"{len(data)} bytes; the reloaded executable runs"


@check("execute.every_device", "a replicated program runs on every addressable device at once",
       requires=("execute.single", "buffers.every_device"))
def check_execute_every_device(ctx: Context) -> str:
    client, count = _several_devices(ctx)
    executable = client.compile(ADD_F32, CompileOptions(num_replicas=count))
    devices = executable.addressable_devices
    if len(devices) != count:
        raise Fail(f"compiled for {count} replicas, the executable has {len(devices)} addressable devices")
    base = np.arange(4, dtype=np.float32)
    args = [[client.buffer_from_host(base + 10 * i, d), client.buffer_from_host(base, d)] for i, d in enumerate(devices)]
    outputs = executable.execute(args)
    for i, (device, (out,)) in enumerate(zip(devices, outputs)):
        expected = base + 10 * i + base
        if out.device.id != device.id:
            raise Fail(f"replica {i}'s output is on device {out.device.id}, not {device.id}")
        if not np.array_equal(out.to_numpy(), expected):
            raise Fail(f"replica {i} on device {device.id} computed {out.to_numpy()}, expected {expected}")
    return f"{count} replicas, each correct on its own device"


@check("execute.spmd", "an SPMD program partitioned over every device reduces across devices",
       requires=("execute.single", "buffers.every_device"))
def check_execute_spmd(ctx: Context) -> str:
    client, count = _several_devices(ctx)
    executable = client.compile(
        spmd_square_and_sum(count), CompileOptions(num_partitions=count, use_spmd_partitioning=True)
    )
    devices = executable.addressable_devices
    x = np.arange(2 * count, dtype=np.float32)
    outputs = executable.execute(_two_per_device(client, x, devices))
    expected_sum = float((x * x).sum())
    for i, (squares, total) in enumerate(outputs):
        shard = squares.to_numpy()
        if not np.array_equal(shard, x[2 * i : 2 * i + 2] ** 2):
            raise Fail(f"partition {i} returned {shard}, expected {x[2 * i : 2 * i + 2] ** 2}")
        if float(total.to_numpy()) != expected_sum:
            raise Fail(f"partition {i} reduced to {float(total.to_numpy())}, expected {expected_sum}")
    return f"{count} partitions; each shard and the cross-device sum ({expected_sum:g}) correct"


@check("execute.shardy", "a program carrying Shardy (sdy) shardings is partitioned by Shardy",
       requires=("execute.single", "buffers.every_device"))
def check_execute_shardy(ctx: Context) -> str:
    client, count = _several_devices(ctx)
    reason = shardy_refusal(client, [int(d.id) for d in client.addressable_devices])
    if reason is not None:
        raise Unsupported(f"{reason}; pjrt-plugins compiles sharded programs for this plugin with GSPMD")
    options = CompileOptions(num_partitions=count, use_spmd_partitioning=True, use_shardy_partitioner=True)
    executable = client.compile(SHARDY_PROBE_PROGRAM.format(n=count, length=2 * count).encode(), options)
    x = np.arange(2 * count, dtype=np.float32)
    devices = executable.addressable_devices
    outputs = executable.execute(_two_per_device(client, x, devices))
    for i, (out,) in enumerate(outputs):
        if not np.array_equal(out.to_numpy(), 2 * x[2 * i : 2 * i + 2]):
            raise Fail(f"partition {i} returned {out.to_numpy()}, expected {2 * x[2 * i : 2 * i + 2]}")
    return f"{count} partitions, each shard correct: sharded programs get the Shardy partitioner"


@check("client.close", "the client is destroyed cleanly", requires=("client.create",))
def check_client_close(ctx: Context) -> str:
    client = ctx.client
    client.close()
    if not client.closed:
        raise Fail("the client is still open after close()")
    return "PJRT_Client_Destroy succeeded"

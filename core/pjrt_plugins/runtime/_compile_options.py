"""CompileOptions: the few xla.CompileOptionsProto fields we need, hand-encoded as protobuf.

Field numbers are those of xla/pjrt/proto/compile_options.proto and xla/xla_data.proto;
the tests check our bytes with jaxlib's own parser. Pure Python: no plugin, no jaxlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._proto import int_field, message_field, packed_ints


#: XLA reads replica, partition and device counts into C++ ints: larger values abort the plugin.
_INT32_MAX = 2**31 - 1
# CompileOptionsProto
_COMPILE_EXECUTABLE_BUILD_OPTIONS = 3
_COMPILE_PORTABLE_EXECUTABLE = 4
# ExecutableBuildOptionsProto
_BUILD_DEVICE_ORDINAL = 1
_BUILD_NUM_REPLICAS = 4
_BUILD_NUM_PARTITIONS = 5
_BUILD_USE_SPMD_PARTITIONING = 6
_BUILD_DEVICE_ASSIGNMENT = 9
_BUILD_PROPAGATE_TO_OUTPUT = 12
_BUILD_PROPAGATE_TO_PARAMETERS = 18
_BUILD_USE_SHARDY_PARTITIONER = 19
# DeviceAssignmentProto and its ComputationDevice
_ASSIGNMENT_REPLICA_COUNT = 1
_ASSIGNMENT_COMPUTATION_COUNT = 2
_ASSIGNMENT_COMPUTATION_DEVICES = 3
_COMPUTATION_REPLICA_DEVICE_IDS = 1


@dataclass(frozen=True)
class CompileOptions:
    """How to compile a program: replicas, partitions, SPMD partitioning, device assignment.

    ``device_assignment[replica][partition]`` is a device id; it must have shape
    ``(num_replicas, num_partitions)``. Counts and ids must fit XLA's 32-bit ints (larger
    ones abort plugins), and ``Client.compile`` refuses options needing more devices than
    the client has. ``None`` lets the plugin choose (its default
    assignment). ``allow_spmd_sharding_propagation_to_output`` (and ``..._to_parameters``)
    lets the SPMD partitioner choose the outputs' (parameters') shardings: True for all, or
    one flag per output (parameter). ``use_shardy_partitioner`` partitions with Shardy (the program
    carries ``sdy`` shardings) instead of GSPMD. ``serialize()`` gives the ``xla.CompileOptionsProto``
    bytes the plugin reads.
    """

    num_replicas: int = 1
    num_partitions: int = 1
    use_spmd_partitioning: bool = False
    device_assignment: Sequence[Sequence[int]] | None = None
    compile_portable_executable: bool = False
    allow_spmd_sharding_propagation_to_output: bool | Sequence[bool] = False
    allow_spmd_sharding_propagation_to_parameters: bool | Sequence[bool] = False
    use_shardy_partitioner: bool = False

    def __post_init__(self) -> None:
        for name in ("num_replicas", "num_partitions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _INT32_MAX:
                raise ValueError(f"CompileOptions.{name} must be an integer from 1 to {_INT32_MAX}, got {value!r}")
        if self.num_replicas * self.num_partitions > _INT32_MAX:
            raise ValueError(
                f"CompileOptions: {self.num_replicas} replicas x {self.num_partitions} partitions is more devices "
                f"than a program can run on (at most {_INT32_MAX})"
            )
        for name in ("allow_spmd_sharding_propagation_to_output", "allow_spmd_sharding_propagation_to_parameters"):
            value = getattr(self, name)
            flags = (value,) if isinstance(value, bool) else tuple(value)
            if not all(isinstance(flag, bool) for flag in flags):
                raise TypeError(f"CompileOptions.{name} must be a bool or a sequence of bools, got {value!r}")
            object.__setattr__(self, name, value if isinstance(value, bool) else flags)
        if self.device_assignment is None:
            return
        try:
            rows = tuple(tuple(int(d) for d in row) for row in self.device_assignment)
        except TypeError:
            raise TypeError(
                "CompileOptions.device_assignment must be a sequence of rows (one per replica) of "
                "device ids (one per partition)"
            ) from None
        shape = (len(rows), {len(r) for r in rows})
        if shape[0] != self.num_replicas or shape[1] != {self.num_partitions}:
            raise ValueError(
                f"CompileOptions.device_assignment must have {self.num_replicas} row(s) of "
                f"{self.num_partitions} device id(s) (replicas x partitions), got {[list(r) for r in rows]}"
            )
        flat = [d for row in rows for d in row]
        if any(not 0 <= d <= _INT32_MAX for d in flat):
            raise ValueError(f"device ids in CompileOptions.device_assignment must be from 0 to {_INT32_MAX}, got {flat}")
        if len(set(flat)) != len(flat):
            raise ValueError(f"CompileOptions.device_assignment repeats a device id: {flat}")
        object.__setattr__(self, "device_assignment", rows)

    def serialize(self) -> bytes:
        """The serialized ``xla.CompileOptionsProto``."""
        build = bytearray()
        build += int_field(_BUILD_DEVICE_ORDINAL, -1)
        build += int_field(_BUILD_NUM_REPLICAS, self.num_replicas)
        build += int_field(_BUILD_NUM_PARTITIONS, self.num_partitions)
        if self.use_spmd_partitioning:
            build += int_field(_BUILD_USE_SPMD_PARTITIONING, 1)
        if self.device_assignment is not None:
            assignment = bytearray()
            assignment += int_field(_ASSIGNMENT_REPLICA_COUNT, self.num_replicas)
            assignment += int_field(_ASSIGNMENT_COMPUTATION_COUNT, self.num_partitions)
            for partition in range(self.num_partitions):
                ids = [row[partition] for row in self.device_assignment]
                computation = packed_ints(_COMPUTATION_REPLICA_DEVICE_IDS, ids)
                assignment += message_field(_ASSIGNMENT_COMPUTATION_DEVICES, computation)
            build += message_field(_BUILD_DEVICE_ASSIGNMENT, bytes(assignment))
        for number, value in (
            (_BUILD_PROPAGATE_TO_OUTPUT, self.allow_spmd_sharding_propagation_to_output),
            (_BUILD_PROPAGATE_TO_PARAMETERS, self.allow_spmd_sharding_propagation_to_parameters),
        ):
            flags = [True] if value is True else ([] if value is False else list(value))
            if flags:
                build += packed_ints(number, [int(flag) for flag in flags])
        if self.use_shardy_partitioner:
            build += int_field(_BUILD_USE_SHARDY_PARTITIONER, 1)
        out = message_field(_COMPILE_EXECUTABLE_BUILD_OPTIONS, bytes(build))
        if self.compile_portable_executable:
            out += int_field(_COMPILE_PORTABLE_EXECUTABLE, 1)
        return out

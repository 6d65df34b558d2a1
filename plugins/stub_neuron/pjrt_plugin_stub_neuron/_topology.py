"""NeuronCore bookkeeping: core counts, NEURON_RT_VISIBLE_CORES lists and the per-process environment.

Pure functions over strings and ints, plus one function that writes the
environment; nothing here opens a library.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from pjrt_plugins import PluginConfigurationError, env_int

logger = logging.getLogger(__name__)

#: How many NeuronCores this host has (PyTorch/XLA's name). The stub defaults to 4.
CHIP_COUNT_ENV = "NEURONCORE_NUM_DEVICES"
#: Which cores the Neuron runtime of this process may use, e.g. ``"0"``, ``"0-3"`` or ``"0,2"``.
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
#: This process's index among all processes of the job.
PROCESS_INDEX_ENV = "NEURON_PJRT_PROCESS_INDEX"
#: Comma-separated device count of every process of the job, e.g. ``"1,1"``.
PROCESSES_NUM_DEVICES_ENV = "NEURON_PJRT_PROCESSES_NUM_DEVICES"
#: Address of the Neuron runtime's root communicator (``host:port``).
ROOT_COMM_ID_ENV = "NEURON_RT_ROOT_COMM_ID"
ROOT_COMM_PORT = 62182
DEFAULT_NUM_CORES = 4

# The NEURON_RT_VISIBLE_CORES value found before we first narrowed it, and the value we set, so that
# configuring twice in one process starts again from the user's list instead of our own narrowing.
_narrowing: dict[str, str | None] = {}


def core_count() -> int:
    """NeuronCores on this host: ``NEURONCORE_NUM_DEVICES``, default 4 for the stub."""
    return env_int(CHIP_COUNT_ENV, default=DEFAULT_NUM_CORES, minimum=0)


def parse_core_list(text: str, *, variable: str = VISIBLE_CORES_ENV) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``; raises PluginConfigurationError (a ValueError) naming ``variable`` if malformed."""
    cores: list[int] = []
    for part in text.replace(" ", "").split(","):
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if low > high:
                    raise ValueError
                cores.extend(range(low, high + 1))
            else:
                cores.append(int(part))
        except ValueError:
            raise PluginConfigurationError(
                f"environment variable {variable}={text!r} is not a core list such as '0', '0-3' or '0,2,5'"
            ) from None
    if any(c < 0 for c in cores) or len(set(cores)) != len(cores):
        raise PluginConfigurationError(f"environment variable {variable}={text!r} lists a negative or repeated core")
    return cores


def format_core_list(cores: Sequence[int]) -> str:
    """``[4, 5, 6]`` -> ``"4-6"``; ``[0, 2]`` -> ``"0,2"``; ``[3]`` -> ``"3"``."""
    if len(cores) > 1 and list(cores) == list(range(cores[0], cores[0] + len(cores))):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def visible_core_count() -> int | None:
    """How many cores NEURON_RT_VISIBLE_CORES gives this process, or ``None`` when it is unset."""
    text = os.environ.get(VISIBLE_CORES_ENV, "").strip()
    return len(parse_core_list(text)) if text else None


def core_for_process(pool: Sequence[int], local_rank: int, local_world_size: int) -> int:
    """The one core local process ``local_rank`` gets from ``pool`` (PyTorch/XLA: one core per process)."""
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is outside 0..{local_world_size - 1}")
    if local_world_size > len(pool):
        raise ValueError(
            f"{local_world_size} local processes need {local_world_size} NeuronCores but only {len(pool)} "
            f"are available ({VISIBLE_CORES_ENV} or {CHIP_COUNT_ENV}); launch fewer processes per host "
            f"or set {CHIP_COUNT_ENV}"
        )
    return pool[local_rank]


def _user_visible_cores() -> str | None:
    current = os.environ.get(VISIBLE_CORES_ENV, "").strip() or None
    if _narrowing and current == _narrowing.get("assigned"):
        return _narrowing.get("original")
    return current


def configure_process_environment(local_rank: int, local_world_size: int, *, host_index: int) -> None:
    """Give this process its own NeuronCore and tell the Neuron runtime about the job.

    Sets NEURON_RT_VISIBLE_CORES to one core (the local rank's, taken from a
    list the user already set there if any), NEURON_PJRT_PROCESS_INDEX to the
    global rank, NEURON_PJRT_PROCESSES_NUM_DEVICES to one entry per process, and
    NEURON_RT_ROOT_COMM_ID (if unset) to MASTER_ADDR:62182.
    """
    user_list = _user_visible_cores()
    pool = parse_core_list(user_list) if user_list else list(range(core_count()))
    core = core_for_process(pool, local_rank, local_world_size)
    world_size = env_int("WORLD_SIZE", default=local_world_size)
    rank = env_int("RANK", default=host_index * local_world_size + local_rank)

    assigned = str(core)
    _narrowing.update(original=user_list, assigned=assigned)
    os.environ[VISIBLE_CORES_ENV] = assigned
    os.environ[PROCESS_INDEX_ENV] = str(rank)
    os.environ[PROCESSES_NUM_DEVICES_ENV] = ",".join("1" for _ in range(world_size))
    if not os.environ.get(ROOT_COMM_ID_ENV):
        os.environ[ROOT_COMM_ID_ENV] = f"{os.environ.get('MASTER_ADDR') or 'localhost'}:{ROOT_COMM_PORT}"
    logger.debug(
        "stub_neuron: local rank %d of %d gets NeuronCore %s (global rank %d of %d)",
        local_rank, local_world_size, assigned, rank, world_size,
    )

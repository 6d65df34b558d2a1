"""Shared pieces of the stub_neuron tests: paths, the variables they scrub, a sanitizer probe, a KV store.

A plain module (not conftest) so test files can import it by name.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
STUB_SOURCE = REPO / "plugins" / "stub_neuron"

#: Every variable the stub's Python half reads or writes, plus the launcher's.
NEURON_ENV_VARS = (
    "NEURON_LIBRARY_PATH",
    "NEURONCORE_NUM_DEVICES",
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_PJRT_PROCESS_INDEX",
    "NEURON_PJRT_PROCESSES_NUM_DEVICES",
    "NEURON_RT_ROOT_COMM_ID",
    "MASTER_ADDR",
    "PJRT_C_API_HEADER",
    "PJRT_DEVICE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "PJRT_LOCAL_PROCESS_RANK",
    "PJRT_LOCAL_PROCESS_COUNT",
)


def sanitizer_available(compiler: str, flag: str, tmp_path: Path) -> bool:
    """Whether ``compiler`` can build and run a program with ``-fsanitize=<flag>``."""
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / f"probe_{flag.replace(',', '_')}"
    built = subprocess.run([compiler, f"-fsanitize={flag}", str(probe), "-o", str(exe)], capture_output=True)
    return built.returncode == 0 and subprocess.run([str(exe)], capture_output=True).returncode == 0


class InMemoryKvStore:
    """A thread-safe dict with the kv_store protocol (get with timeout, try_get, put).

    It stands in for torch.distributed's TCPStore, which the multi-process tests use;
    here several clients in one process share it from different threads.
    """

    def __init__(self, *, fail_puts_with: Exception | None = None) -> None:
        self._values: dict[str, bytes] = {}
        self._changed = threading.Condition()
        self.fail_puts_with = fail_puts_with
        self.puts: list[tuple[str, bytes]] = []

    def put(self, key: str, value: bytes) -> None:
        if self.fail_puts_with is not None:
            raise self.fail_puts_with
        with self._changed:
            self._values[key] = bytes(value)
            self.puts.append((key, bytes(value)))
            self._changed.notify_all()

    def try_get(self, key: str) -> bytes | None:
        with self._changed:
            return self._values.get(key)

    def get(self, key: str, timeout_ms: int) -> bytes:
        deadline = time.monotonic() + timeout_ms / 1000
        with self._changed:
            while key not in self._values:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"key {key!r} did not appear within {timeout_ms} ms")
                self._changed.wait(left)
            return self._values[key]

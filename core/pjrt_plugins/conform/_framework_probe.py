"""Drive one PJRT library through a real framework, in a process of its own; run as a script.

``python _framework_probe.py xla_client|jax|torch_xla`` reads ``{"library_path",
"options"}`` as JSON on stdin, creates a client through that framework, lists the
devices and moves an array there and back. Before each step it sends a ``phase``
event, so when the plugin crashes the process, the parent knows which step did it.
The last event is the ``result``. Events go on the parent's private channel, never
stdout, so what the plugin library prints cannot pass for one.

Standalone on purpose: it imports only the standard library, numpy and the
framework, so it runs under any interpreter that has the framework (torch_xla
often lives in a virtual environment of its own, without pjrt-plugins).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from typing import Any

#: Prefix of every event line on the event channel (anything else is ignored by the parent).
PROBE_MARK = "@@pjrt-plugins-probe@@ "
#: Names the descriptor of the event channel the parent opened (``_child_process.CHANNEL_FD_VAR``,
#: spelt out: this file imports nothing of pjrt_plugins). Its token comes first on stdin.
CHANNEL_FD_VAR = "PJRT_PLUGINS_EVENT_FD"
#: Names the python of an environment with torch_xla, when it is not this one (conform, the tests).
TORCH_XLA_PYTHON_ENV = "PJRT_PLUGINS_TORCH_XLA_PYTHON"
#: The name the library is registered under in the framework (torch_xla upper-cases it).
PROBE_NAME = "pjrtconform"


_channel: Any = None  # the private event channel, when the parent opened one
_token = ""


def open_channel() -> None:
    """Take the parent's event channel (never stdout, where the plugin library prints) and its token."""
    global _channel, _token
    raw = os.environ.pop(CHANNEL_FD_VAR, None)
    if raw is None:  # started by hand: events on stdout
        return
    fd = int(raw)
    os.set_inheritable(fd, False)
    _token = sys.stdin.readline().strip()
    _channel = os.fdopen(fd, "w", buffering=1, encoding="utf-8")


def emit(**event: Any) -> None:
    stream = _channel if _channel is not None else sys.stdout
    stream.write((f"{PROBE_MARK}{_token} " if _token else PROBE_MARK) + json.dumps(event, default=str) + "\n")
    stream.flush()


def phase(name: str) -> None:
    emit(phase=name)


def sample() -> Any:
    import numpy as np

    return np.arange(12, dtype=np.float32).reshape(3, 4) * 1.5 - 4


def probe_xla_client(library_path: str, options: dict[str, Any]) -> dict[str, Any]:
    """jaxlib's C API client (XLA's PjRtCApiClient): create it and list the devices."""
    from jaxlib import xla_client

    phase("load")
    xla_client.load_pjrt_plugin_dynamically(PROBE_NAME, library_path)
    xla_client.initialize_pjrt_plugin(PROBE_NAME)
    phase("create")
    client = xla_client.make_c_api_client(PROBE_NAME, options)
    phase("devices")
    devices = client.devices()
    described = [repr(d) for d in devices[:2]] + [f"kind {devices[0].device_kind!r}"] if devices else []
    return {
        "platform": client.platform,
        "devices": len(devices),
        "addressable": len(client.local_devices()),
        "described": described,
    }


def probe_jax(library_path: str, options: dict[str, Any]) -> dict[str, Any]:
    """JAX: register the library as a plugin, list its devices, put an array on the last one and read it back."""
    os.environ["JAX_PLATFORMS"] = PROBE_NAME
    import jax
    import numpy as np
    from jax._src import xla_bridge

    phase("load")
    xla_bridge.register_plugin(PROBE_NAME, library_path=library_path, options=options)
    phase("create")
    devices = jax.devices(PROBE_NAME)
    phase("upload")
    expected = sample()
    array = jax.device_put(expected, devices[-1])
    phase("download")
    back = np.asarray(array)
    if back.shape != expected.shape or not np.array_equal(back, expected):
        raise AssertionError(f"the array came back as {back!r}, expected {expected!r}")
    return {"devices": len(devices), "described": [repr(d) for d in devices[:2]], "round_trip": True}


def probe_torch_xla(library_path: str, options: dict[str, Any]) -> dict[str, Any]:
    """torch_xla: register the library as a DevicePlugin, count devices, move a tensor there and back."""
    device_type = PROBE_NAME.upper()  # torch_xla keys plugins by upper-case name; no '_' (it splits on it)
    os.environ["PJRT_DEVICE"] = device_type
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    from torch_xla.experimental import plugins

    class ProbePlugin(plugins.DevicePlugin):
        def library_path(self) -> str:
            return library_path

        def client_create_options(self) -> dict[str, Any]:
            return dict(options)

    phase("load")
    plugins.register_plugin(device_type, ProbePlugin())
    phase("create")
    count = xr.global_runtime_device_count()
    phase("upload")
    expected = torch.from_numpy(sample())
    tensor = expected.to(torch_xla.device())
    phase("download")
    back = tensor.cpu()
    if not torch.equal(back, expected):
        raise AssertionError(f"the tensor came back as {back!r}, expected {expected!r}")
    return {"devices": int(count), "round_trip": True}


PROBES = {"xla_client": probe_xla_client, "jax": probe_jax, "torch_xla": probe_torch_xla}


def main() -> None:
    faulthandler.enable()  # a crash prints the Python stack to stderr
    open_channel()
    request = json.loads(sys.stdin.read())
    try:
        result = PROBES[sys.argv[1]](request["library_path"], dict(request.get("options") or {}))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which turns it into a FAIL
        emit(error=f"{type(exc).__name__}: {exc}")
        sys.exit(1)
    emit(result=result)


if __name__ == "__main__":
    main()

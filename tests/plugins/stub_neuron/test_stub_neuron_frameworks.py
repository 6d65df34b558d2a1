"""The stub in the real frameworks: JAX 0.10.2 through its jax_plugins entry point, torch_xla 2.9 through
register_plugin and through its installed torch_xla.plugins entry point.

Each framework runs in a subprocess: before the stub filled the slots XLA's C++ client
calls unchecked (PJRT_Client_TopologyDescription first), both died there with SIGSEGV.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pjrt_plugins.conform as conform_package
from _support import link_installed_distributions
from pjrt_plugin_tpu import count_tpu_chips
from pjrt_plugins.conform._framework_probe import TORCH_XLA_PYTHON_ENV

PROBE = Path(conform_package.__file__).with_name("_framework_probe.py")


def run_jax(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PJRT_", "NEURON"))}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environment, timeout=180)


def test_jax_platforms_stub_neuron_lists_its_devices_and_round_trips_arrays():
    result = run_jax(
        """
        import jax, numpy as np
        devices = jax.devices()
        print([repr(d) for d in devices], {d.platform for d in devices}, {d.device_kind for d in devices})
        for dtype in (np.float32, np.int8, np.bool_, np.float64):
            expected = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
            array = jax.device_put(expected, devices[-1])
            back = np.asarray(array)
            assert back.dtype == expected.dtype and np.array_equal(back, expected), (dtype, back)
            assert array.devices() == {devices[-1]}
        print("round trips ok")
        """,
        JAX_PLATFORMS="stub_neuron",
        JAX_ENABLE_X64="1",
        NEURONCORE_NUM_DEVICES="3",  # read by the plugin's hooks: the create options come from them
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "['NeuronDevice(id=0)', 'NeuronDevice(id=1)', 'NeuronDevice(id=2)'] {'neuron'} {'NeuronCore (stub)'}"
    assert lines[1] == "round trips ok"


def test_what_the_stub_cannot_do_in_jax_is_an_error_not_a_crash():
    # jax.jit asks every device for memory statistics before compiling, and a put to another device
    # copies between memories: NULL slots there were segfaults.
    result = run_jax(
        """
        import jax, numpy as np
        x = jax.device_put(np.ones(3, np.float32), jax.devices()[0])
        print(jax.devices()[0].memory_stats())
        for attempt in (lambda: jax.jit(lambda a: a + 1)(x), lambda: jax.device_put(x, jax.devices()[1])):
            try:
                attempt()
            except jax.errors.JaxRuntimeError as exc:
                print(str(exc).splitlines()[0])
        """,
        JAX_PLATFORMS="stub_neuron",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    stats, jit, copy = result.stdout.splitlines()
    assert stats == "None"
    assert jit.startswith("UNIMPLEMENTED: the stub_neuron plugin has no compiler"), jit
    assert copy.startswith("UNIMPLEMENTED: PJRT_Buffer_CopyToMemory: the stub_neuron plugin has no copies"), copy


#: What a user has who installed jax and every backend (base installs, no extras).
JAX_AND_OUR_BACKENDS = ("jax", "pjrt-plugins", "pjrt-plugin-cpu", "pjrt-plugin-gpu", "pjrt-plugin-tpu",
                        "pjrt-plugin-stub-neuron")


def test_plain_jax_devices_prints_no_plugin_error_with_every_backend_installed(tmp_path):
    # Exactly what installing jax and our backends brings: those distributions and what they require, as
    # installed here, linked into one site directory. (The test environment itself also has
    # pjrt-plugin-gpu's [cuda13-local] extra: jax-cuda13-pjrt alone is half of JAX's CUDA support, and with
    # it JAX prints "Jax plugin configuration error" on every jax.devices(); see the gpu README.)
    linked = link_installed_distributions(JAX_AND_OUR_BACKENDS, tmp_path / "site", tmp_path)
    assert {"jax", "jaxlib", "libtpu", "xla-cpu-pjrt", "pjrt-plugin-stub-neuron"} <= set(linked), linked
    code = "import site, sys; site.addsitedir(sys.argv[1]); import jax; print(jax.devices())"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PJRT_", "NEURON"))}
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(tmp_path / "site")], capture_output=True,
                            text=True, env=environment, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[CpuDevice(id=0)]"
    for text in ("Jax plugin configuration error", "Traceback", "cuda_plugin_extension", "Unable to initialize backend",
                 "could not determine TPU", "E0000"):
        assert text not in result.stderr, result.stderr[-3000:]
    # the stub (negative priority) is registered only when JAX_PLATFORMS asks for it: no warning about it
    assert "stub_neuron" not in result.stderr, result.stderr[-3000:]


def test_only_the_stub_publishes_a_jax_entry_point_and_importing_it_imports_no_jax():
    ours = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="jax_plugins")
            if ep.dist is not None and ep.dist.metadata["Name"].startswith("pjrt-plugin")}
    # JAX has its own CPU, CUDA and TPU support: our cpu, gpu and tpu backends must not register again.
    # The tpu backend's entry point registers no platform: it only prepares libtpu's environment.
    assert ours == {"stub_neuron": "pjrt_plugin_stub_neuron.jax_plugin", "pjrt_plugin_tpu": "pjrt_plugin_tpu.jax_plugin"}
    result = run_jax(
        """
        import sys, pjrt_plugin_stub_neuron.jax_plugin as module, pjrt_plugin_tpu.jax_plugin as tpu
        assert callable(module.initialize) and callable(tpu.initialize)
        print(sorted(m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jaxlib"))))
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


def test_the_tpu_entry_point_registers_nothing_and_gives_libtpu_one_host_off_tpu_hosts():
    result = run_jax(
        """
        import os, jax
        from jax._src import xla_bridge
        jax.devices()
        print(sorted(xla_bridge._backend_factories))
        print(os.environ.get("TPU_WORKER_HOSTNAMES"), os.environ.get("TPU_HOST_BOUNDS"))
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    platforms, topology = result.stdout.strip().splitlines()
    assert "pjrt_plugin_tpu" not in platforms and "tpu" in platforms  # JAX's own TPU factory, nothing of ours
    if count_tpu_chips() == 0:
        assert topology == "localhost 1,1,1"
        for text in ("could not determine", "unexpected worker hostname", "E0000"):
            assert text not in result.stderr, result.stderr[-3000:]
    else:
        assert topology == "None None"  # a TPU host keeps the metadata server's topology


def test_register_with_jax_refuses_a_name_jax_owns_and_skips_one_it_has():
    result = run_jax(
        """
        import jax
        from jax._src import xla_bridge
        from pjrt_plugins.jax_plugin import register_with_jax
        try:
            register_with_jax("cuda")
        except ValueError as exc:
            print("refused:", exc)
        xla_bridge.backends()  # plugins discovered: the stub was registered because JAX_PLATFORMS names it
        print(register_with_jax("stub_neuron"))
        """,
        JAX_PLATFORMS="cpu,stub_neuron",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    refused, again = result.stdout.splitlines()
    assert refused.startswith("refused: plugin 'cuda' cannot be registered with JAX under a name JAX owns")
    assert again == "False"


@pytest.fixture
def torch_xla_python() -> str:
    python = os.environ.get(TORCH_XLA_PYTHON_ENV, "").strip()
    if not python:
        pytest.skip(
            f"torch_xla lives in its own virtual environment (torch 2.9); set {TORCH_XLA_PYTHON_ENV} to its "
            "python (shared/tools/torch-xla-2.9-venv.sh builds one) to run this test"
        )
    return python


def test_torch_xla_registers_the_stub_counts_its_devices_and_round_trips_a_tensor(torch_xla_python, stub_library):
    python = torch_xla_python
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PJRT_DEVICE")}
    request = {"library_path": str(stub_library), "options": {"num_devices": 3}}
    result = subprocess.run([python, "-I", str(PROBE), "torch_xla"], input=json.dumps(request), capture_output=True,
                            text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("@@")]
    assert events[-1] == {"result": {"devices": 3, "round_trip": True}}, events


# What `PJRT_DEVICE=STUB-NEURON python train.py` does in a torch_xla environment where the stub is installed.
TORCH_XLA_BY_ENTRY_POINT = """
import json, site, sys
site.addsitedir(sys.argv[1])  # after torch_xla's own site-packages: its torch and numpy win
import torch, torch_xla, pjrt_plugins
import torch_xla.runtime as xr
from torch_xla.experimental import plugins
out = {"ours": pjrt_plugins.default_plugin().name, "device_type": xr.device_type()}
try:
    out["default"] = type(plugins.default()).__name__
    out["devices"] = xr.global_runtime_device_count()
    tensor = torch.arange(6.0).to(torch_xla.device())
    out["round_trip"] = tensor.cpu().tolist()
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def test_pjrt_device_stub_neuron_selects_the_installed_stub_in_torch_xla(torch_xla_python, tmp_path):
    # The stub as installed here (its real entry points), no register_plugin() call: torch_xla registers
    # installed plugins by default, upper-cased, and takes its device type from PJRT_DEVICE up to the first '_'.
    linked = link_installed_distributions(("pjrt-plugins", "pjrt-plugin-stub-neuron"), tmp_path / "site", tmp_path)
    assert "pjrt-plugin-stub-neuron" in linked, linked

    def run(device: str) -> dict:
        environment = {k: v for k, v in os.environ.items()
                       if k != "PYTHONPATH" and not k.startswith(("PJRT_", "NEURON", "XLA_"))}
        result = subprocess.run([torch_xla_python, "-I", "-c", TORCH_XLA_BY_ENTRY_POINT, str(tmp_path / "site")],
                                capture_output=True, text=True, env={**environment, "PJRT_DEVICE": device}, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    selected = run("STUB-NEURON")
    assert selected == {"ours": "stub-neuron", "device_type": "STUB-NEURON", "default": "StubNeuronPlugin",
                        "devices": 4, "round_trip": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]}
    # The '_' spelling reaches the stub in pjrt_plugins only: torch_xla reads device type STUB. That is why the
    # entry point is spelt with '-'.
    split = run("STUB_NEURON")
    assert split["ours"] == "stub-neuron" and split["device_type"] == "STUB" and split["error"] == "KeyError: 'STUB'"

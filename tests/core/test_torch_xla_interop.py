"""PyTorch/XLA interop: plain torch_xla-style classes are adapted; our targets answer torch_xla's calls.

torch_xla itself is too heavy for CI (about 4 GB); the tests against the real PyTorch/XLA
2.9 run where PJRT_PLUGINS_TORCH_XLA_PYTHON names the python of an environment with it.
"""

from __future__ import annotations

import sys
import types

import pytest

from pjrt_plugins import DevicePlugin, PluginUnavailableError, hookimpl
from pjrt_plugins._torch_xla import TorchXlaStylePlugin, torch_xla_contract_problems

TORCH_XLA_STYLE = """
import os

class Base:  # the shape of torch_xla.experimental.plugins.DevicePlugin: methods only
    def library_path(self):
        raise NotImplementedError()

    def configure_single_process(self):
        raise NotImplementedError()

class FooPlugin(Base):
    def library_path(self):
        return __file__

    def client_create_options(self):
        return {"foo_mode": "fast", "foo_cores": [0, 1]}

    def physical_chip_count(self):
        return 2

    def host_index(self):
        return 3

    def configure_multiprocess(self, local_rank, local_world_size):
        os.environ["FOO_VISIBLE_CORE"] = f"{local_rank}/{local_world_size}"
"""


def test_a_torch_xla_style_class_is_adapted_to_the_hooks(site, run_isolated):
    site.add("foo-xla-plugin", "0.3", modules={"foo_xla": TORCH_XLA_STYLE}, plugins={"foo": "foo_xla:FooPlugin"})
    result = run_isolated(
        """
        import json, os, pjrt_plugins as p
        foo = p.get_plugin("foo")
        foo.configure_single_process()            # NotImplementedError in the wrapped class -> core default
        foo.configure_multiprocess(1, 2)          # forwarded
        print(json.dumps({
            "type": type(foo).__name__, "is_device_plugin": isinstance(foo, p.DevicePlugin),
            "wrapped": type(foo.wrapped).__name__,
            "library_ok": foo.library_path().endswith("foo_xla.py"),
            "options": foo.client_create_options(), "chips": foo.physical_chip_count(),
            "host": foo.host_index(), "coordinator": foo.requires_xla_coordinator(),
            "priority": foo.priority(), "rng": foo.rng_default(), "env": os.environ.get("FOO_VISIBLE_CORE"),
            "available": foo.is_available(), "distribution": foo.distribution,
        }))
        """
    )
    assert result.returncode == 0 and not result.stderr, result
    assert result.json() == {
        "type": "TorchXlaStylePlugin",
        "is_device_plugin": True,
        "wrapped": "FooPlugin",
        "library_ok": True,
        "options": {"foo_mode": "fast", "foo_cores": [0, 1]},
        "chips": 2,
        "host": 3,
        "coordinator": False,
        "priority": 0,
        "rng": "default",
        "env": "1/2",
        "available": True,
        "distribution": "foo-xla-plugin",
    }


# The order PyTorch/XLA 2.9 uses: ep.load()(), then these calls (configure ones change the
# environment, so this runs in a child process).
CONTRACT = """
import json, importlib.metadata as md
from pjrt_plugins import PluginUnavailableError
from pjrt_plugins._torch_xla import is_torch_xla_distribution, torch_xla_contract_problems, torch_xla_name_problem

report = {}
for ep in md.entry_points(group="torch_xla.plugins"):
    if is_torch_xla_distribution(ep.dist):
        continue
    obj = ep.load()()
    problems = torch_xla_contract_problems(obj, call_configure=True)
    unavailable = [p for p in problems if p.startswith("library_path() raised PluginUnavailableError")]
    report[ep.name] = {"problems": [p for p in problems if p not in unavailable], "unavailable": bool(unavailable),
                       "dist": ep.dist.name, "name": torch_xla_name_problem(ep.name)}
print(json.dumps(report))
"""


def test_every_installed_entry_point_target_satisfies_the_torch_xla_method_contract(
    site, run_installed, plugin_source
):
    # Our reference backends (as installed in this environment) plus a test distribution.
    site.add("alpha-dist", "1.0", modules={"alpha_mod": plugin_source("Alpha")}, plugins={"alpha": "alpha_mod:Alpha"})
    result = run_installed(CONTRACT)
    assert result.returncode == 0, result
    report = result.json()
    assert {"alpha", "cpu", "gpu", "tpu", "stub-neuron"} <= set(report)
    assert {name: entry["problems"] for name, entry in report.items()} == {name: [] for name in report}
    # and PJRT_DEVICE=<NAME> can select each of them in torch_xla (no '_' in an entry point)
    assert {name: entry["name"] for name, entry in report.items()} == {name: None for name in report}
    # Only a plugin that is really unavailable here may refuse library_path(), and then with our error type.
    assert not report["alpha"]["unavailable"]


def test_the_contract_check_catches_wrong_types_and_missing_methods():
    class Sloppy:
        def library_path(self):
            return 42

        def client_create_options(self):
            return {"ok": 1, "bad": object(), 3: "x", "lst": [1, "2"]}

        def requires_xla_coordinator(self):
            return "no"

        def physical_chip_count(self):
            return True

        def host_index(self):
            raise RuntimeError("boom")

    problems = torch_xla_contract_problems(Sloppy())
    assert "library_path() returned int 42, expected str" in problems
    assert "requires_xla_coordinator() returned str 'no', expected bool" in problems
    assert "physical_chip_count() returned bool True, expected int" in problems
    assert "host_index() raised RuntimeError: boom" in problems
    assert "configure_single_process() is missing" in problems
    assert any("['bad'] is object" in p for p in problems)
    assert any("key 3 is not a str" in p for p in problems)
    assert any("['lst'] is a list with non-int items" in p for p in problems)


class Unavailable(DevicePlugin):
    @hookimpl
    def pjrt_library_path(self):
        return None


def test_our_base_class_answers_the_contract_and_refuses_a_missing_library_with_our_error():
    problems = torch_xla_contract_problems(Unavailable(), call_configure=True)
    assert len(problems) == 1 and problems[0].startswith("library_path() raised PluginUnavailableError")
    with pytest.raises(PluginUnavailableError, match="could not be found"):
        Unavailable().library_path()


def test_instances_subclass_torch_xla_base_when_fake_torch_xla_module_is_loaded(monkeypatch):
    """Fake stand-in for torch_xla.experimental.plugins (the real one is checked by hand, see notes)."""
    fake_module = types.ModuleType("torch_xla.experimental.plugins")

    init_calls = []

    class FakeTorchXlaDevicePlugin:
        def __init__(self):
            init_calls.append(type(self).__name__)

    fake_module.DevicePlugin = FakeTorchXlaDevicePlugin
    monkeypatch.setitem(sys.modules, "torch_xla.experimental.plugins", fake_module)
    plugin = Unavailable()
    assert isinstance(plugin, FakeTorchXlaDevicePlugin) and isinstance(plugin, Unavailable)
    assert init_calls == ["Unavailable"]  # our __init__ chains to torch_xla's (pybind needs it)
    assert type(plugin).__name__ == "Unavailable"
    assert type(Unavailable()) is type(plugin)  # one mixed class per backend class
    adapted = TorchXlaStylePlugin(object())
    assert isinstance(adapted, FakeTorchXlaDevicePlugin)
    monkeypatch.delitem(sys.modules, "torch_xla.experimental.plugins")
    assert not isinstance(Unavailable(), FakeTorchXlaDevicePlugin)


# -- against the real torch_xla 2.9, where a virtual environment with it is at hand -------------

#: The python of a torch 2.9 + torch_xla 2.9 environment (a venv with torch==2.9.0 and torch_xla==2.9.0; too heavy for CI).
TORCH_XLA_PYTHON_VAR = "PJRT_PLUGINS_TORCH_XLA_PYTHON"

REAL_TORCH_XLA = """
import json, os
import torch_xla
from torch_xla.experimental import plugins
import torch_xla.runtime as xr
from pjrt_plugins._torch_xla import torch_xla_name_note
if os.environ.get("REGISTER"):  # by hand, as with XLA_REGISTER_INSTALLED_PLUGINS=0
    if os.environ.get("DYNAMIC"):
        plugins.use_dynamic_plugins()
    from mycpu_mod import MyCpu
    plugins.register_plugin(os.environ["PJRT_DEVICE"], MyCpu())
out = {"registered": {name: type(p).__name__ for name, p in plugins._plugin_registry.items()},
       "dynamic": os.environ.get("PJRT_DYNAMIC_PLUGINS"), "device_type": xr.device_type(),
       "notes": {name: torch_xla_name_note(name, "my-cpu-plugin") for name in os.environ["NAMES"].split()}}
try:
    default = plugins.default()
    out["default"] = [type(default).__name__, default.library_path() == os.environ["LIB"]]
    out["devices"] = xr.global_runtime_device_count()
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def torch_xla_python() -> str:
    import os
    from pathlib import Path

    python = os.environ.get(TORCH_XLA_PYTHON_VAR, "")
    if not python or not Path(python).is_file():
        pytest.skip(f"needs torch_xla 2.9: set {TORCH_XLA_PYTHON_VAR} to the python of an environment that has it")
    return python


def test_the_documented_torch_xla_variables_and_name_rules_hold_in_real_torch_xla(
    torch_xla_python, site, deps_dir, plugin_source, cpu_library
):
    import json
    import subprocess

    from core_support import CORE_DIR, child_env

    body = "@hookimpl\ndef pjrt_client_create_options(self):\n    return {'cpu_device_count': 2}\n"
    source = plugin_source("MyCpu", library=repr(cpu_library), body=body)
    spellings = ("mycpu", "my-cpu", "my_cpu", "cpu", "tpu")  # tpu and cpu: names torch_xla itself handles
    site.add("my-cpu-plugin", modules={"mycpu_mod": source}, plugins={name: "mycpu_mod:MyCpu" for name in spellings})

    def run(env):
        proc = subprocess.run(
            [torch_xla_python, "-c", REAL_TORCH_XLA], capture_output=True, text=True, timeout=300,
            env=child_env([site.root, CORE_DIR, deps_dir], {"LIB": cpu_library, "NAMES": " ".join(spellings), **env}),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    # XLA_REGISTER_INSTALLED_PLUGINS (default 1) registers the installed entry points, upper-cased, and
    # turns on PJRT_DYNAMIC_PLUGINS; PJRT_DEVICE then selects ours, '-' and all.
    on = run({"PJRT_DEVICE": "MY-CPU"})
    assert {"MYCPU", "MY_CPU", "MY-CPU"} <= set(on["registered"]) and on["dynamic"] == "1"
    assert on["default"] == ["MyCpu", True] and on["devices"] == 2
    # What `list` says about each name (its torch_xla column), which the runs here bear out.
    assert on["notes"]["mycpu"] is None and on["notes"]["my-cpu"] is None
    # torch_xla's own tpu entry point is registered after ours (ours comes first on sys.path): it wins the name.
    assert on["registered"]["TPU"] == "TpuPlugin" and "publishes its own 'tpu' entry point" in on["notes"]["tpu"]
    off = run({"PJRT_DEVICE": "MYCPU", "XLA_REGISTER_INSTALLED_PLUGINS": "0"})
    assert "MYCPU" not in off["registered"] and off["dynamic"] is None
    # Then registering by hand is not enough: the runtime takes a plugin only with PJRT_DYNAMIC_PLUGINS set.
    by_hand = run({"PJRT_DEVICE": "MYCPU", "XLA_REGISTER_INSTALLED_PLUGINS": "0", "REGISTER": "1"})
    assert by_hand["registered"] == {"MYCPU": "MyCpu"} and by_hand["error"] == "RuntimeError: Unknown PJRT_DEVICE: 'MYCPU'"
    dynamic = run({"PJRT_DEVICE": "MYCPU", "XLA_REGISTER_INSTALLED_PLUGINS": "0", "REGISTER": "1", "DYNAMIC": "1"})
    assert dynamic["dynamic"] == "1" and dynamic["default"] == ["MyCpu", True] and dynamic["devices"] == 2
    # A '_' in the name: torch_xla's device type is the part before it, and its lookup fails.
    split = run({"PJRT_DEVICE": "MY_CPU"})
    assert split["device_type"] == "MY" and split["error"] == "KeyError: 'MY'"
    assert "device type 'MY'" in on["notes"]["my_cpu"] and "'my-cpu' instead" in on["notes"]["my_cpu"]
    # PJRT_DEVICE=CPU: torch_xla finds our plugin but runs its built-in CPU client (1 device, not our 2).
    cpu = run({"PJRT_DEVICE": "CPU"})
    assert cpu["default"] == ["MyCpu", True] and cpu["devices"] == 1
    assert "built-in CPU client" in on["notes"]["cpu"]

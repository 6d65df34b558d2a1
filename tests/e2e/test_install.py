"""End to end: pip-install every package's wheel from the release wheelhouse into a new virtual environment, use them there.

Offline and quick: third-party dependencies (numpy, the vendor libraries, ...) are
not downloaded but linked in from the running environment; our own packages come
only from the wheels scripts/release built (the session's ``release_wheelhouse``).
"""

from __future__ import annotations

import email
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from _support import link_installed_distributions, requirement_applies
from e2e_support import FreshVenv, wheels_in
from pjrt_plugins.conform._programs import spmd_square_and_sum

pytestmark = pytest.mark.e2e

PROJECTS = {"pjrt-plugins", "pjrt-plugin-cpu", "pjrt-plugin-gpu", "pjrt-plugin-tpu", "pjrt-plugin-stub-neuron"}
BACKENDS = {"cpu", "gpu", "tpu", "stub-neuron"}
#: Extras installed with a wheel: the gpu backend's CUDA 13 plugin without the CUDA runtime wheels.
EXTRAS = {"pjrt-plugin-gpu": "cuda13-local"}

#: x * x and sum(x * x) of a 16-vector split over 8 devices (the conformance kit's program, built here).
SPMD_PROGRAM = spmd_square_and_sum(8, shard_length=2)


# -- third-party dependencies, linked in rather than downloaded -------------------------------------


def _wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(archive.read(name))
    return [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]


def _link_third_party(wheels: dict[str, Path], site: Path, target_site_packages: Path) -> list[str]:
    """Make the wheels' third-party dependencies importable in the new venv, linked from this environment."""
    roots = {
        canonicalize_name(r.name)
        for distribution, wheel in wheels.items()
        for r in _wheel_requirements(wheel)
        if requirement_applies(r) or requirement_applies(r, EXTRAS.get(distribution, ""))
    } - set(wheels)
    return link_installed_distributions(roots, site, target_site_packages)


@pytest.fixture(scope="module")
def venv(release_wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> FreshVenv:
    workdir = tmp_path_factory.mktemp("e2e")
    fresh = FreshVenv.create(workdir / "venv", workdir / "work")
    fresh.wheels = wheels_in(release_wheelhouse)
    assert set(fresh.wheels) == set(PROJECTS), fresh.wheels
    _link_third_party(fresh.wheels, workdir / "third_party", fresh.site_packages)
    # No --no-deps: pip must find every declared dependency (ours in the wheels, the rest linked in).
    requested = [f"{wheel}[{EXTRAS[name]}]" if name in EXTRAS else str(wheel) for name, wheel in fresh.wheels.items()]
    fresh.pip("install", "--no-index", "--find-links", str(release_wheelhouse), *requested)
    return fresh


# -- the tests ----------------------------------------------------------------------------------


def test_our_packages_come_from_the_wheels_not_the_repository(venv):
    assert "pjrt-plugin-stub-neuron" in venv.wheels, "plugins/stub_neuron is part of the end-to-end install"
    result = venv.run(
        """
        import importlib.metadata, json
        import pjrt_plugins, pjrt_plugin_cpu, pjrt_plugin_gpu, pjrt_plugin_tpu, pjrt_plugin_stub_neuron
        mods = [pjrt_plugins, pjrt_plugin_cpu, pjrt_plugin_gpu, pjrt_plugin_tpu, pjrt_plugin_stub_neuron]
        print(json.dumps([m.__file__ for m in mods]))
        """
    )
    assert result.returncode == 0, result.stderr
    for module_file in eval(result.stdout):
        assert Path(module_file).is_relative_to(venv.root), module_file


def test_import_registers_the_four_backends(venv):
    result = venv.run(
        """
        import pjrt_plugins
        print(sorted(pjrt_plugins.registered_plugins()))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    assert set(eval(result.stdout)) == BACKENDS


def _listed_names(listing: str) -> set[str]:
    """The first word of every line of ``python -m pjrt_plugins list`` (the table's name column and more)."""
    return {line.split()[0] for line in listing.splitlines() if line.strip()}


def test_cli_lists_the_four_backends(venv):
    result = venv.run_args(["-m", "pjrt_plugins", "list"])
    assert result.returncode == 0, result.stderr
    assert BACKENDS <= _listed_names(result.stdout), result.stdout


def test_cpu_runs_a_program_on_eight_devices(venv):
    result = venv.run(
        f"""
        import numpy as np
        import pjrt_plugins
        from pjrt_plugins.runtime import CompileOptions
        x = np.arange(16, dtype=np.float32)
        with pjrt_plugins.create_client("cpu") as client:
            assert len(client.devices) == 8, client.devices
            exe = client.compile({SPMD_PROGRAM!r}, CompileOptions(num_partitions=8, use_spmd_partitioning=True))
            devices = exe.addressable_devices
            args = [[client.buffer_from_host(x[2 * i:2 * i + 2], device=d)] for i, d in enumerate(devices)]
            outs = exe.execute(args)
            squares = np.concatenate([o[0].to_numpy() for o in outs])
            sums = sorted({{float(o[1].to_numpy()) for o in outs}})
        assert (squares == x * x).all(), squares
        print("devices=8 sums=", sums)
        """,
        env={"CPU_NUM_DEVICES": "8"},
    )
    assert result.returncode == 0, result.stderr
    assert "devices=8 sums= [1240.0]" in result.stdout  # sum of the squares of 0..15


def test_stub_creates_a_client_with_n_devices_and_round_trips_a_buffer(venv):
    result = venv.run(
        """
        import numpy as np
        import pjrt_plugins
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        with pjrt_plugins.create_client("stub_neuron", {"num_devices": 3}) as client:
            print("platform", client.platform_name, "devices", len(client.devices))
            back = client.buffer_from_host(data, device=client.devices[2]).to_numpy()
        print("round trip", back.dtype, back.shape, bool((back == data).all()))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "platform neuron devices 3" in result.stdout
    assert "round trip float32 (3, 4) True" in result.stdout


def test_tpu_fails_fast_with_a_clear_message(venv):
    from pjrt_plugin_tpu import count_tpu_chips

    if count_tpu_chips() > 0:
        pytest.skip("this host has TPU chips; the test proves the no-TPU path")
    result = venv.run(
        """
        import pjrt_plugins
        try:
            pjrt_plugins.create_client("tpu")
        except pjrt_plugins.PluginUnavailableError as exc:
            print("PluginUnavailableError:", exc)
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "PluginUnavailableError:" in result.stdout and "no TPU chips found" in result.stdout


def test_gpu_fails_fast_with_the_plugins_reason(venv):
    result = venv.run(
        """
        import pjrt_plugins
        try:
            pjrt_plugins.create_client("gpu")
        except pjrt_plugins.PjrtError as exc:
            print("PjrtError:", exc)
        """,
        env={"CUDA_VISIBLE_DEVICES": ""},  # hides every GPU, so the no-GPU path runs on any host
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "PjrtError:" in result.stdout and "No visible GPU devices." in result.stdout


def test_uninstalling_a_backend_removes_it_from_the_list(venv):
    venv.pip("uninstall", "--yes", "pjrt-plugin-tpu")
    try:
        listing = venv.run_args(["-m", "pjrt_plugins", "list"])
        registered = venv.run("import pjrt_plugins; print(sorted(pjrt_plugins.registered_plugins()))")
        assert listing.returncode == 0 and registered.returncode == 0, listing.stderr + registered.stderr
        assert set(eval(registered.stdout)) == BACKENDS - {"tpu"}
        names = _listed_names(listing.stdout)
        assert "tpu" not in names and BACKENDS - {"tpu"} <= names, listing.stdout
    finally:
        venv.pip("install", "--no-index", "--no-deps", str(venv.wheels["pjrt-plugin-tpu"]))


"""JAX's plugin packages are plugins too: real third-party wheels from the package index, installed with --no-deps.

jax-tt-plugin (Tenstorrent; its library in jax_plugins/libtt) and jax-qnn (Qualcomm; only a
Windows DLL inside) are downloaded once per session and installed into a temporary site
directory; jax-cuda13-pjrt is already installed, as pjrt-plugin-gpu requires it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CLI = ["-m", "pjrt_plugins"]
#: Small real JAX plugin wheels (about 84 MB and 46 kB), pinned so the test sees the same files.
WHEELS = ("jax-tt-plugin==0.1.3", "jax-qnn==0.1.0")


@pytest.fixture(scope="session")
def jax_wheel_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory holding the real JAX plugin wheels (installed, not imported)."""
    root = tmp_path_factory.mktemp("jax-wheels")
    site = root / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    download = subprocess.run(
        [*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(root / "wheels"), *WHEELS],
        capture_output=True, text=True, timeout=600,
    )
    if download.returncode != 0:
        pytest.fail(f"could not download {WHEELS} from the package index:\n{download.stderr[-2000:]}")
    install = subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(site), *map(str, sorted((root / "wheels").glob("*.whl")))],
        capture_output=True, text=True, timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return site


def rows_of(result) -> dict[str, dict]:
    return {row["name"]: row for row in json.loads(result.stdout)["plugins"] if row["status"] != "shadowed"}


def test_jax_plugin_wheels_are_listed_with_their_library_and_a_reason(run_installed, jax_wheel_site):
    result = run_installed([*CLI, "list", "--json"], {"PYTHONPATH": str(jax_wheel_site)})
    assert result.returncode == 0, result
    rows = rows_of(result)
    libtt = rows["libtt"]
    assert libtt["distribution"] == "jax-tt-plugin" and libtt["version"] == "0.1.3"
    assert libtt["library_path"] == str(jax_wheel_site / "jax_plugins" / "libtt" / "libtt.so")
    assert libtt["status"] == "unavailable" and "no Tenstorrent device found" in libtt["reason"]
    assert libtt["origin"] == "entry point jax_plugins: libtt = jax_plugins.libtt"
    qnn = rows["qnn"]
    assert qnn["library_path"] is None and qnn["status"] == "unavailable"
    assert "no PJRT library for this platform" in qnn["reason"] and "pjrt_qnn.dll" in qnn["reason"]
    # Our gpu backend wraps jax-cuda13-pjrt: one plugin, both origins, the JAX name as an alias.
    assert "cuda13" not in rows
    gpu = rows["gpu"]
    assert any(origin.startswith("JAX plugin package jax-cuda13-pjrt") for origin in gpu["also"])
    assert gpu["library_path"].endswith("jax_plugins/xla_cuda13/xla_cuda_plugin.so")
    assert {"cuda", "cuda13"} <= set(gpu["aliases"])
    assert rows["cpu"]["default"] is True  # a JAX package without its hardware never takes the default


def test_doctor_and_devices_work_on_a_jax_plugin_package(run_installed, jax_wheel_site):
    # qnn, whose library is not there: opening libtt.so (140 MB) for the API version costs ~40 s here.
    env = {"PYTHONPATH": str(jax_wheel_site)}
    doctor = run_installed([*CLI, "doctor", "qnn", "--json"], env)
    report = json.loads(doctor.stdout)["plugins"][0]
    checks = {c["check"]: c for c in report["checks"]}
    assert report["status"] == "unavailable" and report["provider"] == "jax-qnn 0.1.0", doctor
    assert checks["loaded"]["ok"] and checks["loaded"]["detail"] == "JaxPackagePlugin"
    assert checks["available"]["ok"] is False and "pjrt_qnn.dll" in checks["available"]["detail"]
    devices = run_installed([*CLI, "devices", "qnn", "--json"], env)
    assert devices.returncode == 1 and json.loads(devices.stdout)["error"]["type"] == "PluginUnavailableError"


CHECK_IMPORT = """
import json, sys, pjrt_plugins as p
records = {r.name: r for r in p.plugin_records()}
libraries = {}
for name in ("libtt", "qnn", "gpu"):
    plugin = p.get_plugin(name)
    libraries[name] = plugin.hook.pjrt_library_path()  # reads RECORD, opens nothing
    plugin.unavailable_reason()
with open("/proc/self/maps") as f:
    mapped = sorted({line.split()[-1] for line in f if "/" in line})
print(json.dumps({
    "names": sorted(records),
    "mapped": [m for m in mapped if m in libraries.values() or "libtt" in m or "cuda_plugin" in m],
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "torch", "torch_xla", "jax_plugins")),
    "libtt": libraries["libtt"],
}))
"""


def test_import_opens_no_jax_plugin_library_and_imports_neither_jax_nor_torch(run_installed, jax_wheel_site):
    result = run_installed(CHECK_IMPORT, {"PYTHONPATH": str(jax_wheel_site)})
    assert result.returncode == 0, result
    data = result.json()
    assert {"libtt", "qnn", "gpu", "cpu"} <= set(data["names"]) and "cuda13" not in data["names"]
    assert data["libtt"].endswith("libtt.so")
    assert data["mapped"] == [] and data["heavy"] == []


def test_the_xla_prefix_is_dropped_for_a_jax_package_no_backend_wraps(site, run_isolated):
    # The real jax-cuda13-pjrt, seen without pjrt-plugin-gpu: its own plugin, named from its package.
    import importlib.metadata

    dist = importlib.metadata.distribution("jax-cuda13-pjrt")
    site_packages = Path(str(dist.locate_file("")))
    (site.root / "jax_plugins").mkdir()
    (site.root / "jax_plugins" / "xla_cuda13").symlink_to(site_packages / "jax_plugins" / "xla_cuda13")
    info = next(site_packages.glob("jax_cuda13_pjrt-*.dist-info"))
    (site.root / info.name).symlink_to(info)
    result = run_isolated(
        """
        import json, pjrt_plugins as p
        plugin = p.get_plugin("CUDA13")
        print(json.dumps([sorted(r.name for r in p.plugin_records()), plugin.library_path(), plugin.unavailable_reason()]))
        """
    )
    assert result.returncode == 0, result
    names, library, reason = result.json()
    assert names == ["cuda13"]
    assert Path(library).resolve() == (site_packages / "jax_plugins/xla_cuda13/xla_cuda_plugin.so").resolve()
    assert reason.startswith("no NVIDIA GPU found on this host")


def test_a_user_turns_the_jax_family_off(run_installed, jax_wheel_site):
    result = run_installed([*CLI, "list", "--json"], {"PYTHONPATH": str(jax_wheel_site), "PJRT_PLUGINS_JAX": "0"})
    rows = rows_of(result)
    assert "libtt" not in rows and "qnn" not in rows and rows["gpu"]["also"] == []


def test_our_own_package_publishing_a_jax_entry_point_stays_one_plugin(site, run_isolated, plugin_source):
    site.add("pjrt-plugin-acme", "1.0", modules={"acme_mod": plugin_source("Acme"), "acme_jax": "import jax\n"},
             plugins={"acme": "acme_mod:Acme"})
    info = next(site.root.glob("pjrt_plugin_acme-*.dist-info"))
    with open(info / "entry_points.txt", "a") as f:
        f.write("[jax_plugins]\nacme = acme_jax\n")
    result = run_isolated("import json, pjrt_plugins as p\nprint(json.dumps([r.name for r in p.plugin_records()]))\n")
    assert result.returncode == 0 and result.json() == ["acme"], result


# -- names PyTorch/XLA and JAX use ----------------------------------------------------------------


def test_pytorch_xla_and_jax_names_reach_our_backends(run_installed):
    result = run_installed(
        """
        import json, os, pjrt_plugins as p
        print(json.dumps([p.get_plugin("CUDA").name, p.default_plugin().name, p.get_plugin("cuda13").name]))
        """,
        {"PJRT_DEVICE": "CUDA"},
    )
    assert result.returncode == 0, result
    assert result.json() == ["gpu", "gpu", "gpu"]


def test_a_real_plugin_named_like_an_alias_wins(site, run_isolated, plugin_source):
    site.add("real-cuda", modules={"cuda_mod": plugin_source("Cuda")}, plugins={"cuda": "cuda_mod:Cuda", "gpu": "cuda_mod:Cuda"})
    result = run_isolated(
        "import json, pjrt_plugins as p\n"
        "print(json.dumps([p.get_plugin('CUDA').name, {r.name: r.aliases for r in p.plugin_records()}]))\n"
    )
    assert result.returncode == 0, result
    assert result.json() == ["cuda", {"cuda": [], "gpu": []}]


# -- a JAX plugin package whose library runs here ------------------------------------------

SPMD_ON_IT = """
import json, torch, pjrt_plugins as p, pjrt_plugins.spmd as xs
record = next(r for r in p.plugin_records() if r.name == "mycpu")
xs.set_plugin("mycpu", options={"cpu_device_count": 4})
mesh = xs.Mesh(range(4), (4,), ("x",))
a = torch.arange(8.0).to("pjrt")
xs.mark_sharding(a, mesh, ("x",))
print(json.dumps([record.origin, (a * 2 + 1).sum().item(), a.sharding_spec]))
"""


def test_devices_conform_and_the_spmd_layer_run_on_a_jax_plugin_package(site, run_installed, cpu_library):
    # A JAX-style namespace package (jax_plugins/xla_mycpu) holding the real CPU plugin library; its
    # __init__ would fail if anything imported it, as JAX packages' import jax.
    package = site.root / "jax_plugins" / "xla_mycpu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('pjrt_plugins must never import a JAX plugin package')\n")
    (package / "xla_mycpu_pjrt.so").symlink_to(cpu_library)
    devices = run_installed([*CLI, "devices", "mycpu", "-o", "cpu_device_count=2", "--json"])
    assert devices.returncode == 0, devices
    data = json.loads(devices.stdout)
    assert (data["plugin"], data["platform_name"], len(data["devices"])) == ("mycpu", "cpu", 2)
    assert data["library_path"] == str(package / "xla_mycpu_pjrt.so")
    conform = run_installed([*CLI, "conform", "mycpu", "--json"], timeout=600)
    assert conform.returncode == 0, conform
    report = json.loads(conform.stdout)
    assert report["summary"]["FAIL"] == 0 and report["verdict"] == "conforms", report["summary"]
    pytest.importorskip("torch", reason="the SPMD part of this test needs torch (pjrt-plugins[spmd])")
    spmd = run_installed(SPMD_ON_IT, timeout=300)
    assert spmd.returncode == 0, spmd
    assert spmd.json() == ["namespace package jax_plugins.xla_mycpu", 64.0, "{devices=[4]0,1,2,3}"]

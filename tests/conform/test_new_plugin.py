"""`pjrt-plugins new-plugin NAME`: the generated package builds, installs and passes conform;
built wheels of pjrt-plugins carry the template."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conform_support import REPO, clean_env
from pjrt_plugins.conform.new_plugin import PluginNames, find_template, write_plugin

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
LEFTOVERS = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o")


def test_every_spelling_of_the_name_is_derived():
    names = PluginNames.from_name("Acme-NPU")
    # '-' in the torch_xla.plugins entry point (PyTorch/XLA cuts PJRT_DEVICE at '_'), '_' for JAX and identifiers
    assert (names.entry_point, names.jax_platform) == ("acme-npu", "acme_npu")
    assert (names.package, names.distribution) == ("pjrt_plugin_acme_npu", "pjrt-plugin-acme-npu")
    assert (names.class_name, names.upper, names.library) == ("AcmeNpuPlugin", "ACME_NPU", "libpjrt_acme_npu.so")
    assert names.rewrite("StubNeuronPlugin reads NEURON_RT_VISIBLE_CORES in pjrt_plugin_stub_neuron") == (
        "AcmeNpuPlugin reads ACME_NPU_RT_VISIBLE_CORES in pjrt_plugin_acme_npu"
    )


@pytest.mark.parametrize("bad", ["cpu", "neuron", "stub_neuron", "stub-neuron", "cuda", "rocm", "9lives", "acme npu", "a__b",
                                 "x" * 41, "pjrt"])
def test_names_that_would_clash_or_cannot_be_identifiers_are_refused(bad):
    with pytest.raises(ValueError, match="plugin name"):
        PluginNames.from_name(bad)


def test_the_cli_refuses_a_bad_name_and_an_occupied_directory(run_cli, tmp_path):
    bad = run_cli("new-plugin", "tpu", "-d", str(tmp_path / "x"))
    assert bad.returncode == 2 and "is taken" in bad.stderr, bad
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    busy = run_cli("new-plugin", "acme", "-d", str(tmp_path / "busy"))
    assert busy.returncode == 1 and "not empty" in busy.stderr, busy
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"


def test_the_template_is_the_stub_source_tree_in_a_checkout():
    assert find_template() == (REPO / "plugins" / "stub_neuron").resolve()


def test_the_generated_package_is_renamed_throughout(tmp_path):
    root, files = write_plugin("acme", tmp_path / "acme")
    relative = sorted(p.relative_to(root).as_posix() for p in files)
    assert "pjrt_plugin_acme/_plugin.py" in relative and "csrc/acme.h" in relative and "setup.py" in relative
    assert "pjrt_plugin_acme/py.typed" in relative  # its annotations reach the vendor's users' type checkers
    for path in files:
        text = path.read_text().replace("from the stub_neuron template", "")  # pyproject's description
        if path.name != "README.md":
            assert "neuron" not in text.lower(), f"{path} still mentions neuron"
        assert "aws" not in text.lower(), f"{path} still names AWS"
    code = "".join(p.read_text() for p in files if p.suffix in (".py", ".c", ".h"))
    readme_variables = set(re.findall(r"`(ACME[A-Z_]*)`", (root / "README.md").read_text()))
    assert "ACMECORE_NUM_DEVICES" in readme_variables
    for variable in readme_variables:
        assert f'"{variable}"' in code, f"the README names {variable}, which the generated code never reads"
    pyproject = (root / "pyproject.toml").read_text()
    assert 'name = "pjrt-plugin-acme"' in pyproject and 'acme = "pjrt_plugin_acme:AcmePlugin"' in pyproject
    assert 'version = {attr = "pjrt_plugin_acme.__version__"}' in pyproject  # one version source
    assert '"pjrt_plugin_acme.libpjrt_acme"' in (root / "setup.py").read_text()
    # visible to JAX too: its own jax_plugins entry point, registering under the new name
    assert '[project.entry-points.jax_plugins]\nacme = "pjrt_plugin_acme.jax_plugin"' in pyproject
    assert 'register_with_jax("acme")' in (root / "pjrt_plugin_acme" / "jax_plugin.py").read_text()


def _install(source: Path, target: Path) -> None:
    command = [*PIP, "install", "--no-deps", "--no-build-isolation", "--no-index", "-q", "--target", str(target), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, env=clean_env(), timeout=300)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"


def test_a_generated_plugin_builds_installs_and_passes_conform(run_cli, tmp_path):
    made = run_cli("new-plugin", "acme-npu", "-d", str(tmp_path / "src"), "--json")
    assert made.returncode == 0, made
    assert made.json()["names"]["entry_point"] == "acme-npu"
    pyproject = (tmp_path / "src" / "pyproject.toml").read_text()
    assert '[project.entry-points."torch_xla.plugins"]\nacme-npu = "pjrt_plugin_acme_npu:AcmeNpuPlugin"' in pyproject
    assert '[project.entry-points.jax_plugins]\nacme_npu = "pjrt_plugin_acme_npu.jax_plugin"' in pyproject
    _install(tmp_path / "src", tmp_path / "site")
    assert (tmp_path / "site" / "pjrt_plugin_acme_npu" / "libpjrt_acme_npu.so").is_file()
    env = {"PYTHONPATH": str(tmp_path / "site")}
    listed = run_cli("list", "--json", env=env)
    row = next(r for r in listed.json()["plugins"] if r["name"] == "acme-npu")
    assert row["status"] == "available" and row["distribution"] == "pjrt-plugin-acme-npu"
    assert row["torch_xla"] is None  # PJRT_DEVICE=ACME-NPU reaches it in PyTorch/XLA
    run = run_cli("conform", "acme_npu", "--json", env=env)  # either spelling
    assert run.returncode == 0, run
    report = run.report()
    assert report["_raw"]["summary"]["FAIL"] == 0
    assert report["python.torch_xla"][0] == "PASS" and report["buffers.bfloat16"][0] == "PASS"
    assert report["client.platform"][0] == "PASS" and "acme_npu" in report["client.platform"][1]
    assert report["compile.program"][0] == "UNSUPPORTED"
    assert report["_raw"]["target"]["distribution"] == "pjrt-plugin-acme-npu"
    # the real frameworks load it: XLA's C++ client and JAX (through the library) ...
    assert report["frameworks.xla_client"][0] == "PASS" and report["frameworks.jax"][0] == "PASS"
    # ... and JAX finds it through its jax_plugins entry point
    jax_run = subprocess.run(
        [sys.executable, "-c", "import jax, numpy as np; d = jax.devices(); print(d, np.asarray(jax.device_put(np.ones(3), d[1])))"],
        capture_output=True, text=True, env=clean_env({**env, "JAX_PLATFORMS": "acme_npu"}), timeout=180,
    )
    assert jax_run.returncode == 0, jax_run.stderr[-3000:]
    assert jax_run.stdout.split("\n")[0].startswith("[AcmeNpuDevice(id=0), AcmeNpuDevice(id=1)")


def test_a_built_core_wheel_carries_the_template_and_new_plugin_uses_it(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for item in REPO.iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copy2(item, source / item.name)
    shutil.copytree(REPO / "core", source / "core", ignore=LEFTOVERS)
    shutil.copytree(REPO / "plugins" / "stub_neuron", source / "plugins" / "stub_neuron", ignore=LEFTOVERS)
    built = subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, env=clean_env(), timeout=300,
    )
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("pjrt_plugins-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    template = "pjrt_plugins/conform/_template/"
    assert {template + "csrc/api.c", template + "setup.py", template + "pjrt_plugin_stub_neuron/_plugin.py"} <= names
    assert not any(n.startswith(template) and n.endswith((".so", ".o")) for n in names)
    _install(wheel, tmp_path / "core")
    env = clean_env({"PYTHONPATH": str(tmp_path / "core")})
    result = subprocess.run(
        [sys.executable, "-m", "pjrt_plugins", "new-plugin", "acme", "-d", str(tmp_path / "acme"), "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    where = subprocess.run(
        [sys.executable, "-c", "from pjrt_plugins.conform.new_plugin import find_template; print(find_template())"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )
    assert where.stdout.strip() == str((tmp_path / "core" / template).resolve()), where
    assert json.loads(result.stdout)["names"]["class_name"] == "AcmePlugin"
    assert (tmp_path / "acme" / "csrc" / "acme.h").is_file()


def _pure_wheel_plugin(tmp_path: Path, library: Path) -> Path:
    """acme_pure as a vendor used to ship a prebuilt library: csrc/ and setup.py deleted, the .so as package data."""
    root, _ = write_plugin("acme_pure", tmp_path / "src")
    shutil.rmtree(root / "csrc")
    (root / "setup.py").unlink()
    shutil.copyfile(library, root / "pjrt_plugin_acme_pure" / "libpjrt_acme_pure.so")
    pyproject = (root / "pyproject.toml").read_text()
    typed = 'pjrt_plugin_acme_pure = ["py.typed"]'
    assert typed in pyproject  # the template's package data, to which the library is added
    (root / "pyproject.toml").write_text(pyproject.replace(typed, 'pjrt_plugin_acme_pure = ["py.typed", "*.so"]'))
    built = subprocess.run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(tmp_path / "dist"), str(root)],
                           capture_output=True, text=True, env=clean_env(), timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    return wheel


def test_conform_warns_when_the_library_sits_in_a_pure_python_wheel(run_cli, tmp_path, stub_library):
    wheel = _pure_wheel_plugin(tmp_path, stub_library)
    _install(wheel, tmp_path / "site")
    run = run_cli("conform", "acme_pure", env={"PYTHONPATH": str(tmp_path / "site")})
    assert run.returncode == 0, run  # a packaging problem, not a C API defect
    assert "warning: the PJRT library libpjrt_acme_pure.so ships inside pjrt-plugin-acme-pure's pure-Python wheel" in run.stdout, run
    assert "py3-none-any" in run.stdout


def test_no_packaging_warning_for_platform_wheels_or_libraries_from_elsewhere(cpu_library_path, stub_library):
    from pjrt_plugins.conform._packaging import pure_wheel_warning

    assert pure_wheel_warning("xla-cpu-pjrt", cpu_library_path) is None  # a manylinux wheel
    assert pure_wheel_warning("pjrt-plugin-cpu", cpu_library_path) is None  # the library is another wheel's
    assert pure_wheel_warning("pjrt-plugin-stub-neuron", stub_library) is None  # an editable checkout
    assert pure_wheel_warning("no-such-distribution", stub_library) is None


# -- a template that is not what it seems ---------------------------------------------------


@pytest.fixture
def template_copy(tmp_path) -> Path:
    """A copy of the real template (its files only), for a test to damage."""
    from pjrt_plugins.conform._build_template import copy_template

    copy = tmp_path / "template"
    copy_template(find_template(), copy)
    return copy


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "secret" / "shadow.h"
    path.parent.mkdir()
    path.write_text("root:SECRET-HASH:19000:0:99999:7:::\n")
    return path


def _refused(run_cli, template: Path, out: Path, *expected: str) -> None:
    run = run_cli("new-plugin", "acme", "-d", str(out), "--template", str(template))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run
    for text in expected:
        assert text in run.stderr, run
    assert not out.exists() or not any(out.rglob("*")), "nothing may be written from a refused template"


def test_a_template_file_that_is_a_symlink_is_refused_by_name(run_cli, template_copy, secret, tmp_path):
    (template_copy / "csrc" / "x.h").symlink_to(secret)
    _refused(run_cli, template_copy, tmp_path / "out", "csrc/x.h", "symbolic link", str(secret))


def test_a_template_directory_that_is_a_symlink_is_refused_by_name(run_cli, template_copy, secret, tmp_path):
    shutil.rmtree(template_copy / "csrc")
    (template_copy / "csrc").symlink_to(secret.parent)
    _refused(run_cli, template_copy, tmp_path / "out", "csrc is a symbolic link", str(secret.parent))


def test_a_template_file_that_is_a_fifo_is_refused_not_waited_on(run_cli, template_copy, tmp_path):
    import os

    os.mkfifo(template_copy / "csrc" / "pipe.c")
    _refused(run_cli, template_copy, tmp_path / "out", "csrc/pipe.c", "not a regular file")


def test_a_template_file_that_is_not_utf8_is_named(run_cli, template_copy, tmp_path):
    (template_copy / "csrc" / "latin.c").write_bytes(b"/* caf\xe9 */\n")
    _refused(run_cli, template_copy, tmp_path / "out", "csrc/latin.c", "not UTF-8")


def test_a_template_file_too_large_is_refused_without_reading_it(template_copy, tmp_path):
    from pjrt_plugins.conform.new_plugin import MAX_TEMPLATE_FILE_BYTES, TemplateFileError

    with open(template_copy / "csrc" / "huge.c", "wb") as f:
        f.truncate(20 << 30)  # sparse: 20 GiB that take no disk
    with pytest.raises(TemplateFileError, match=r"csrc/huge\.c .* more than the 4 MiB"):
        write_plugin("acme", tmp_path / "out", template=template_copy)
    assert MAX_TEMPLATE_FILE_BYTES == 4 << 20
    assert not (tmp_path / "out").exists()


def test_a_template_reached_through_a_symlink_is_still_read(template_copy, tmp_path):
    link = tmp_path / "template-link"
    link.symlink_to(template_copy)  # the --template argument itself may be a link: only what is inside counts
    root, written = write_plugin("acme", tmp_path / "out", template=link)
    assert (root / "csrc" / "api.c").is_file() and len(written) > 5

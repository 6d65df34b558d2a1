"""Untrusted directories and odd input: the CLI never runs code from where the user stands, never dies on a stray line.

Each test runs the real command line (the installed console script, which puts no
working directory on the path) or the real resolution code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import pjrt_plugins
from pjrt_plugins import DevicePlugin, PluginNotFoundError, hookimpl

SCRIPT = Path(sys.executable).with_name("pjrt-plugins")


def run_script(args, *, cwd: Path, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    from core_support import child_env

    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, env=child_env([], env), timeout=timeout
    )


# -- a file named like a plugin -------------------------------------------------------


def test_a_registered_name_wins_over_a_file_of_that_name_in_the_working_directory(tmp_path, monkeypatch):
    from pjrt_plugins.conform import resolve_target

    (tmp_path / "cpu").write_bytes(b"\x7fELF not really a library")
    monkeypatch.chdir(tmp_path)
    target = resolve_target("cpu")
    assert (target.mode, target.plugin, target.library_path) == ("plugin", "cpu", None)
    explicit = resolve_target("./cpu")  # a path must look like one
    assert (explicit.mode, explicit.library_path) == ("library", str(tmp_path / "cpu"))


def test_an_unknown_name_is_not_taken_for_a_file_and_the_error_says_how_to_name_the_file(tmp_path, monkeypatch):
    from pjrt_plugins.conform import resolve_target

    (tmp_path / "mylib").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PluginNotFoundError, match=r"write \./mylib"):
        resolve_target("mylib")
    assert resolve_target("mylib.so").mode == "library"


# -- child processes import nothing from the working directory ----------------------------


def test_doctor_children_import_nothing_from_the_working_directory(tmp_path, cpu_library):
    (tmp_path / "json.py").write_text("open(__file__ + '.imported', 'w').close()\nraise SystemExit('json.py from the cwd')\n")
    (tmp_path / "pjrt_plugins.py").write_text("raise SystemExit('pjrt_plugins.py from the cwd')\n")
    result = run_script(["doctor", "library", "--json"], cwd=tmp_path, env={"PJRT_LIBRARY_PATH": cpu_library})
    assert not (tmp_path / "json.py.imported").exists(), result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert [c["check"] for c in report["plugins"][0]["checks"] if c["ok"]] == [
        "loaded", "available", "library", "api version", "client", "partitioner"
    ]


def test_an_isolated_child_finds_the_parents_path_and_editable_installs_but_not_the_cwd(tmp_path, site, monkeypatch):
    from pjrt_plugins._child_process import child_environment, python_command

    check = "import json, sys, pjrt_plugins, extra_mod\nprint(json.dumps([extra_mod.VALUE, pjrt_plugins.__file__, '' in sys.path]))\n"
    site.add("extra-dist", modules={"extra_mod": "VALUE = 42\n", "child_check": check})
    (tmp_path / "extra_mod.py").write_text("VALUE = 'from the cwd'\n")
    monkeypatch.syspath_prepend(str(site.root))  # as PYTHONPATH would put it on the parent's path
    result = subprocess.run(
        python_command("child_check"), env=child_environment(), cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    value, core_file, cwd_on_path = json.loads(result.stdout)
    assert value == 42 and not cwd_on_path
    assert Path(core_file).resolve() == Path(pjrt_plugins.__file__).resolve()  # the editable install


# -- stray output and bad values -----------------------------------------------------------


def test_a_plugin_printing_doctors_own_marker_does_not_kill_doctor(tmp_path, site, plugin_source, cpu_library):
    body = (
        "@hookimpl\ndef pjrt_preflight(self):\n"
        "    print('@@pjrt-plugins-doctor@@ {not json')\n"
        "    print('@@pjrt-plugins-doctor@@ {\"check\": \"client\", \"ok\": true, \"bogus\": 1}')\n"
    )
    site.add("marker-dist", modules={"marker_mod": plugin_source("Marker", library=repr(cpu_library), body=body)},
             plugins={"marker": "marker_mod:Marker"})
    from core_support import child_env

    result = subprocess.run(
        [str(SCRIPT), "doctor", "marker", "--json"], capture_output=True, text=True, cwd=tmp_path,
        env=child_env([site.root]), timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    checks = json.loads(result.stdout)["plugins"][0]["checks"]
    assert [c["check"] for c in checks] == ["loaded", "available", "library", "api version", "client", "memory",
                                            "partitioner"]
    assert all(c["ok"] for c in checks[:-2]) and checks[-1]["ok"]
    assert checks[-2]["ok"] is None  # the CPU plugin has no memory statistics: skipped, not failed


@pytest.mark.parametrize("command", ["doctor", "conform"])
@pytest.mark.parametrize("value", ["inf", "0", "-1", "nan"])
def test_a_timeout_that_is_not_a_finite_positive_number_is_a_usage_error(tmp_path, command, value):
    args = [command, "cpu", "--timeout", value]
    result = run_script(args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "must be a finite number of seconds above 0" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["list", "doctor", "conform cpu"])
@pytest.mark.parametrize("value", ["9e18", "1e300"])
def test_a_timeout_longer_than_the_platform_can_wait_is_a_usage_error(tmp_path, command, value):
    """Such a limit used to reach threading's waits and end in an OverflowError traceback."""
    result = run_script([*command.split(), "--timeout", value], cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "must be at most 9223372036 seconds" in result.stderr and "Traceback" not in result.stderr


# -- look-alike names ----------------------------------------------------------------------


class Quiet(DevicePlugin):
    @hookimpl
    def pjrt_library_path(self):
        return __file__


def test_fullwidth_names_are_folded_and_invisible_characters_refused(clean_registry):
    plugin = pjrt_plugins.register_plugin("ｃｏｒｅ－ｔｅｓｔ－ｗｉｄｅ", Quiet)
    assert plugin.name == "core-test-wide" and pjrt_plugins.get_plugin("Core-Test-Wide") is plugin
    with pytest.raises(ValueError, match=r"U\+200B ZERO WIDTH SPACE"):
        pjrt_plugins.register_plugin("core-test\u200b", Quiet)
    with pytest.raises(ValueError, match="invalid plugin name"):
        pjrt_plugins.get_plugin("cpu\u2060")  # WORD JOINER: not a way to reach 'cpu'


def test_an_installed_entry_point_with_an_invisible_character_is_skipped_with_a_warning(site, run_isolated, plugin_source):
    site.add("sneaky-dist", modules={"sneaky_mod": plugin_source("Sneaky")}, plugins={"cpu\u200b": "sneaky_mod:Sneaky"})
    result = run_isolated(
        "import json, warnings\nwarnings.simplefilter('always')\nimport pjrt_plugins as p\n"
        "print(json.dumps([r.name for r in p.plugin_records()]))\n"
    )
    assert result.returncode == 0, result
    assert result.json() == [] and "U+200B ZERO WIDTH SPACE" in result.stderr

"""The `pjrt-plugins` command: list, devices, doctor, each with and without --json, and exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

CLI = ["-m", "pjrt_plugins"]


@pytest.fixture
def listed_site(site, plugin_source):
    site.add("acme-alpha", "1.2", modules={"alpha_mod": plugin_source("Alpha", priority=5)}, plugins={"alpha": "alpha_mod:Alpha"})
    site.add("broken-dist", "0.9", modules={"broken_mod": "raise ImportError('needs libbroken.so')"}, plugins={"broken": "broken_mod:X"})
    site.add("zeta-alpha", "3.0", modules={"zeta_mod": plugin_source("Zeta")}, plugins={"alpha": "zeta_mod:Zeta"})
    site.add("torch-xla", "2.9.0", modules={"txla_mod": plugin_source("Neuron")}, plugins={"neuron": "txla_mod:Neuron"})
    return site


def isolated_cli(run_isolated, *args: str, env=None):
    code = f"import sys; from pjrt_plugins.cli import main; sys.exit(main({list(args)!r}))"
    return run_isolated(code, env)


def test_list_prints_a_table_of_every_plugin_and_its_status(listed_site, run_isolated):
    result = isolated_cli(run_isolated, "list")
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "LIBRARY", "PRIORITY", "STATUS"]
    table = [line for line in lines[2:] if line and not line.startswith((" ", "*", "Reasons"))]
    rows = {(line.split()[0], line.split()[-1]): line for line in table}
    assert len(rows) == len(table) == 4
    alpha = rows[("alpha", "available")]
    assert "acme-alpha 1.2" in alpha and "alpha_mod.py" in alpha and " 5 " in alpha
    assert "zeta-alpha 3.0" in rows[("alpha", "shadowed")]
    assert "alpha *" in result.stdout  # the default plugin is marked
    assert "broken-dist 0.9" in rows[("broken", "failed")]
    assert "torch-xla 2.9.0" in rows[("neuron", "deferred")]
    assert "  broken (failed): ImportError: needs libbroken.so" in result.stdout
    assert "  alpha (shadowed): the name is taken by acme-alpha 1.2" in result.stdout


def test_list_json_gives_the_same_facts(listed_site, run_isolated):
    result = isolated_cli(run_isolated, "list", "--json")
    assert result.returncode == 0, result
    rows = json.loads(result.stdout)["plugins"]
    by_status = {(r["name"], r["status"]) for r in rows}
    assert by_status == {("alpha", "available"), ("alpha", "shadowed"), ("broken", "failed"), ("neuron", "deferred")}
    alpha = next(r for r in rows if r["name"] == "alpha" and r["status"] == "available")
    assert alpha["distribution"] == "acme-alpha" and alpha["version"] == "1.2" and alpha["priority"] == 5
    assert alpha["default"] is True and alpha["library_path"].endswith("alpha_mod.py")
    shadowed = next(r for r in rows if r["status"] == "shadowed")
    assert shadowed["distribution"] == "zeta-alpha"


def test_list_with_nothing_installed_says_what_to_do(run_isolated):
    result = isolated_cli(run_isolated, "list")
    assert result.returncode == 0 and "No PJRT plugins are installed" in result.stdout, result


def test_the_console_script_and_usage_errors():
    script = Path(sys.executable).with_name("pjrt-plugins")
    assert script.exists(), "the pjrt-plugins console script is not installed next to this Python"
    import subprocess

    version = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("pjrt-plugins "), version
    missing = subprocess.run([str(script)], capture_output=True, text=True)
    assert missing.returncode == 2 and "required: COMMAND" in missing.stderr
    bad = subprocess.run([str(script), "doctor", "--timeout", "soon"], capture_output=True, text=True)
    assert bad.returncode == 2


# -- devices and doctor against the real CPU plugin (through the runtime) ----------------


def test_devices_creates_a_client_and_lists_its_devices(run_installed, cpu_library):
    env = {"PJRT_LIBRARY_PATH": cpu_library}
    text = run_installed([*CLI, "devices", "library", "-o", "cpu_device_count=2"], env)
    assert text.returncode == 0, text
    assert f"library  {cpu_library} (PJRT C API 0." in text.stdout
    table = text.stdout.split("ID  KIND", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert [line.split()[:2] for line in table] == [["0", "cpu"], ["1", "cpu"]]

    data = run_installed([*CLI, "devices", "--json"], {**env, "PJRT_DEVICE": "LIBRARY"})
    assert data.returncode == 0, data
    parsed = json.loads(data.stdout)
    assert parsed["plugin"] == "library" and parsed["platform_name"] == "cpu"
    assert parsed["library_path"] == cpu_library and parsed["api_version"].startswith("0.")
    assert [d["id"] for d in parsed["devices"]] == list(range(len(parsed["devices"])))
    assert all(d["addressable"] for d in parsed["devices"])


def test_devices_of_an_unknown_plugin_fails_with_the_installed_list(run_installed):
    text = run_installed([*CLI, "devices", "nosuchdevice"])
    assert text.returncode == 1
    assert "PluginNotFoundError: no PJRT plugin named 'nosuchdevice'. Installed plugins:" in text.stderr
    data = run_installed([*CLI, "devices", "nosuchdevice", "--json"])
    assert data.returncode == 1 and json.loads(data.stdout)["error"]["type"] == "PluginNotFoundError"
    bad_option = run_installed([*CLI, "devices", "-o", "no-equals-sign"])
    assert bad_option.returncode == 2 and "is not KEY=VALUE" in bad_option.stderr


def test_doctor_checks_a_working_plugin_end_to_end(run_installed, cpu_library):
    env = {"PJRT_LIBRARY_PATH": cpu_library}
    text = run_installed([*CLI, "doctor", "library"], env)
    assert text.returncode == 0, text
    for check in ("loaded", "available", "library", "api version", "client"):
        assert f"[  ok] {check}" in text.stdout, text
    assert "=> ok" in text.stdout
    assert "runtime: compiled fast path loaded" in text.stdout
    data = run_installed([*CLI, "doctor", "library", "--json"], env)
    report = json.loads(data.stdout)
    assert data.returncode == 0 and report["ok"] is True
    assert report["runtime"] == {"fastpath": True, "reason": ""}
    without = run_installed([*CLI, "doctor", "library"], {**env, "PJRT_PLUGINS_FASTPATH": "0"})
    assert without.returncode == 0 and "runtime: Python path, without the compiled fast path (PJRT_PLUGINS_FASTPATH=0 is set)" in without.stdout
    checks = {c["check"]: c for c in report["plugins"][0]["checks"]}
    assert checks["api version"]["detail"].startswith("0.") and checks["client"]["detail"].startswith("cpu, ")
    assert checks["partitioner"]["ok"] and checks["partitioner"]["detail"].startswith("shardy")


def test_doctor_reports_a_broken_plugin_with_its_reason_and_fix(site, run_installed):
    site.add("broken-dist", "0.9", modules={"broken_mod": "raise ImportError('needs libbroken.so')"}, plugins={"broken": "broken_mod:X"})
    text = run_installed([*CLI, "doctor", "broken"])
    assert text.returncode == 1, text
    assert "[FAIL] loaded       ImportError: needs libbroken.so" in text.stdout
    assert "fix: reinstall or upgrade broken-dist" in text.stdout
    data = run_installed([*CLI, "doctor", "broken", "--json"])
    report = json.loads(data.stdout)
    assert data.returncode == 1 and report["ok"] is False and report["plugins"][0]["status"] == "broken"


def test_doctor_survives_a_plugin_that_hangs_and_one_that_aborts(site, run_installed, plugin_source, cpu_library):
    library = repr(cpu_library)
    site.add(
        "hang-dist",
        "1.0",
        modules={"hang_mod": plugin_source("Hang", library=library, body="@hookimpl\ndef pjrt_preflight(self):\n    import time; time.sleep(600)\n")},
        plugins={"hang": "hang_mod:Hang"},
    )
    site.add(
        "abort-dist",
        "1.0",
        modules={"abort_mod": plugin_source("Abort", library=library, body="@hookimpl\ndef pjrt_preflight(self):\n    import os; os.abort()\n")},
        plugins={"abort": "abort_mod:Abort"},
    )
    result = run_installed([*CLI, "doctor", "hang", "abort", "--timeout", "10", "--json"], timeout=90)
    assert result.returncode == 1, result
    reports = {r["name"]: r for r in json.loads(result.stdout)["plugins"]}
    hang = {c["check"]: c for c in reports["hang"]["checks"]}
    assert hang["api version"]["ok"] is True  # the stages before the hang finished and were kept
    assert hang["client"]["ok"] is False and hang["client"]["detail"].startswith("timed out after")
    assert "raise --timeout" in hang["client"]["fix"]
    abort = {c["check"]: c for c in reports["abort"]["checks"]}
    assert abort["client"]["ok"] is False and "was killed by SIGABRT" in abort["client"]["detail"]
    assert "crashed the process" in abort["client"]["fix"]


def test_doctor_over_everything_installed_here_finds_nothing_broken(run_installed):
    # The development environment: the reference backends plus libtpu and the CUDA plugin without a GPU.
    data = run_installed([*CLI, "doctor", "--json", "--timeout", "60"], timeout=400)
    report = json.loads(data.stdout)
    statuses = {r["name"]: r["status"] for r in report["plugins"]}
    assert statuses and set(statuses.values()) <= {"ok", "unavailable", "skipped"}, data
    assert data.returncode == 0 and report["ok"] is True

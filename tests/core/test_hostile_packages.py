"""One bad installed package never breaks the others: real installed distributions, real processes.

Discovery reads metadata only; a plugin's code runs when the plugin is asked for,
and `list` runs it in a child process, one plugin at a time, within a time limit.
"""

from __future__ import annotations

import json
import time

import pytest

CLI = ["-m", "pjrt_plugins"]


@pytest.fixture
def good(site, plugin_source):
    site.add("good-dist", "1.0", modules={"good_mod": plugin_source("Good", priority=3)}, plugins={"good": "good_mod:Good"})


def rows_of(result) -> dict[str, dict]:
    return {row["name"]: row for row in json.loads(result.stdout)["plugins"] if row["status"] != "shadowed"}


def test_an_entry_point_value_that_names_nothing_fails_alone(site, good, run_isolated, run_installed):
    site.add("colons-dist", "0.1", plugins={"colons": ":::"})
    result = run_isolated(
        "import json, pjrt_plugins as p\n"
        "print(json.dumps([list(p.registered_plugins()), p.plugin_records()[0].status, p.plugin_records()[0].failure]))\n"
    )
    assert result.returncode == 0, result
    names, status, failure = result.json()
    assert names == ["good"] and status == "failed" and "':::' is not 'module:attribute'" in failure
    assert "skipping plugin 'colons' from colons-dist 0.1" in result.stderr
    listed = run_installed([*CLI, "list", "--json"])
    assert listed.returncode == 0, listed
    assert rows_of(listed)["colons"]["status"] == "failed" and rows_of(listed)["good"]["status"] == "available"


def test_sys_exit_at_import_is_a_failure_of_that_plugin(site, good, run_isolated):
    site.add("exit-dist", "0.1", modules={"exit_mod": "import sys\nsys.exit(3)\n"}, plugins={"exiter": "exit_mod:X"})
    result = run_isolated(
        """
        import json, pjrt_plugins as p
        out = {"imported": __import__("sys").modules.get("exit_mod") is not None}
        out["registered"] = list(p.registered_plugins())
        try:
            p.get_plugin("exiter")
        except p.PluginLoadError as exc:
            out["error"] = str(exc)
        out["default"] = p.default_plugin().name
        print(json.dumps(out))
        """
    )
    assert result.returncode == 0, result
    data = result.json()
    assert data["imported"] is False  # import pjrt_plugins ran none of it
    assert data["registered"] == ["good"] and data["default"] == "good"
    assert "failed to import: SystemExit: 3" in data["error"]


def test_os_exit_at_import_does_not_end_import_or_list(site, good, run_isolated, run_installed):
    site.add("bye-dist", "0.1", modules={"bye_mod": "import os\nos._exit(7)\n"}, plugins={"bye": "bye_mod:X"})
    imported = run_isolated("import json, pjrt_plugins as p\nprint(json.dumps([r.name for r in p.plugin_records()]))\n")
    assert imported.returncode == 0 and imported.json() == ["bye", "good"], imported
    listed = run_installed([*CLI, "list", "--json"])
    assert listed.returncode == 0, listed
    rows = rows_of(listed)
    assert rows["bye"]["status"] == "failed" and "exited with status 7" in rows["bye"]["reason"]
    assert rows["good"]["status"] == "available"
    assert rows["cpu"]["status"] == "available"  # the installed backends are all still there


def test_a_plugin_that_sleeps_at_import_costs_list_its_time_limit_only(site, good, run_isolated, run_installed):
    site.add("nap-dist", "0.1", modules={"nap_mod": "import time\ntime.sleep(600)\n"}, plugins={"nap": "nap_mod:X"})
    started = time.monotonic()
    imported = run_isolated("import pjrt_plugins as p\nprint(len(p.plugin_records()))\n", timeout=60)
    assert imported.returncode == 0 and imported.stdout.strip() == "2", imported
    listed = run_installed([*CLI, "list", "--json", "--timeout", "3"], timeout=120)
    assert listed.returncode == 0, listed
    rows = rows_of(listed)
    assert rows["nap"]["status"] == "failed" and "timed out after 3 s" in rows["nap"]["reason"]
    assert rows["good"]["status"] == "available"
    assert time.monotonic() - started < 100


def test_a_plugin_printing_at_import_leaves_json_output_clean(site, run_installed, plugin_source, cpu_library):
    noisy = "print('hello from the noisy plugin')\n" + plugin_source("Noisy", library=repr(cpu_library))
    site.add("noisy-dist", "0.1", modules={"noisy_mod": noisy}, plugins={"noisy": "noisy_mod:Noisy"})
    listed = run_installed([*CLI, "list", "--json"])
    assert listed.returncode == 0 and rows_of(listed)["noisy"]["status"] == "available", listed
    devices = run_installed([*CLI, "devices", "noisy", "--json"])  # the plugin's code runs in this process
    assert devices.returncode == 0, devices
    assert json.loads(devices.stdout)["plugin"] == "noisy"
    assert "hello from the noisy plugin" in devices.stderr


def test_the_cli_honours_autoload_off(site, run_installed, plugin_source, cpu_library, tmp_path):
    marker = tmp_path / "imported"
    watched = f"open({str(marker)!r}, 'w').close()\n" + plugin_source("Watched")
    site.add("watched-dist", "0.1", modules={"watched_mod": watched}, plugins={"watched": "watched_mod:Watched"})
    env = {"PJRT_PLUGINS_AUTOLOAD": "0", "PJRT_LIBRARY_PATH": cpu_library}
    listed = run_installed([*CLI, "list", "--json"], env)
    assert listed.returncode == 0, listed
    assert [r["name"] for r in json.loads(listed.stdout)["plugins"]] == ["library"]
    assert json.loads(listed.stdout)["installed_plugins_discovered"] is False
    text = run_installed([*CLI, "list"], env)
    assert "PJRT_PLUGINS_AUTOLOAD is off" in text.stdout
    missing = run_installed([*CLI, "devices", "watched"], env)
    assert missing.returncode == 1 and "PluginNotFoundError" in missing.stderr
    assert not marker.exists()


def test_a_deeply_nested_json_config_fails_that_library_only(site, good, run_isolated, tmp_path):
    config = tmp_path / "deep.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    result = run_isolated(
        "import json, pjrt_plugins as p\nprint(json.dumps([[r.name, r.status] for r in p.plugin_records()]))\n",
        {"PJRT_NAMES_AND_LIBRARY_PATHS": f"deep:{config}"},
    )
    assert result.returncode == 0, result
    assert result.json() == [["deep", "failed"], ["good", "deferred"]]
    assert "RecursionError" in result.stderr and "cannot read PJRT plugin config" in result.stderr


def test_nothing_a_plugin_does_at_import_runs_before_it_is_asked_for(site, good, run_isolated, tmp_path):
    marker = tmp_path / "ran"
    site.add("eager-dist", "0.1", modules={"eager_mod": f"open({str(marker)!r}, 'w').close()\n"}, plugins={"eager": "eager_mod:X"})
    result = run_isolated("import pjrt_plugins as p\np.get_plugin('good')\nprint(sorted(r.name for r in p.plugin_records()))\n")
    assert result.returncode == 0 and "'eager'" in result.stdout, result
    assert not marker.exists()


# -- a broken setting of the plugin the user meant is an error, not another plugin ----------


SELECT = """
import json, pjrt_plugins as p
try:
    out = {"default": p.default_plugin().name}
except Exception as exc:
    out = {"error": type(exc).__name__, "message": str(exc)}
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    "variable, value",
    [("CPU_NUM_DEVICES", "abc"), ("CPU_NUM_DEVICES", "-1"), ("CPU_NUM_DEVICES", "0"), ("PJRT_CPU_LIBRARY_PATH", "/dev/zero")],
)
def test_a_malformed_cpu_setting_stops_default_selection_naming_the_variable(run_installed, variable, value):
    # The installed backends: cpu (priority 0, the default here) and stub-neuron (-100) below it.
    result = run_installed(SELECT, {variable: value})
    assert result.returncode == 0, result
    data = result.json()
    assert data.get("error") == "PluginConfigurationError", data
    assert f"{variable}=" in data["message"] and "plugin 'cpu'" in data["message"]
    assert "PJRT_DEVICE" in data["message"]  # how to choose another plugin on purpose


def test_list_and_doctor_show_a_misconfigured_plugin(run_installed):
    env = {"CPU_NUM_DEVICES": "abc"}
    listed = run_installed([*CLI, "list", "--json"], env)
    cpu = rows_of(listed)["cpu"]
    assert cpu["status"] == "misconfigured" and "CPU_NUM_DEVICES='abc'" in cpu["reason"]
    assert not any(row["default"] for row in rows_of(listed).values())
    doctor = run_installed([*CLI, "doctor", "cpu", "--json"], env)
    report = json.loads(doctor.stdout)["plugins"][0]
    assert doctor.returncode == 1 and report["status"] == "broken"
    available = next(c for c in report["checks"] if c["check"] == "available")
    assert "CPU_NUM_DEVICES" in available["detail"] and "fix or unset" in available["fix"]


# -- a library named only by the environment gets its backend's option schema ----------------


def test_an_environment_named_backend_library_gets_the_backends_option_schema(run_installed, cpu_library):
    env = {"PJRT_LIBRARY_PATH": cpu_library}
    result = run_installed(
        """
        import json, pjrt_plugins as p
        out = {}
        for value in ("abc", 0):
            try:
                p.create_client("library", {"cpu_device_count": value})
            except (TypeError, ValueError) as exc:
                out[repr(value)] = type(exc).__name__ + ": " + str(exc)
        print(json.dumps(out))
        """,
        env,
    )
    assert result.returncode == 0, result  # on a bad value the library would abort the process
    data = result.json()
    assert data["'abc'"].startswith("TypeError") and "cpu_device_count" in data["'abc'"]
    assert data["0"].startswith("PluginConfigurationError") and "between 1 and" in data["0"]
    cli = run_installed([*CLI, "devices", "library", "-o", "cpu_device_count=abc"], env)
    assert cli.returncode == 2 and "option cpu_device_count='abc': expected int64" in cli.stderr, cli

"""Library-only plugins named by PJRT_LIBRARY_PATH and PJRT_NAMES_AND_LIBRARY_PATHS."""

from __future__ import annotations

import json

DESCRIBE = """
import json, pjrt_plugins as p
out = {}
for record in p.plugin_records():
    try:
        plugin = p.get_plugin(record.name)
        out[record.name] = {"path": plugin.library_path(), "options": plugin.client_create_options(),
                            "priority": plugin.priority(), "class": type(plugin).__name__}
    except p.PluginLoadError as exc:
        out[record.name] = {"error": str(exc)}
print(json.dumps(out))
"""


def test_pjrt_library_path_registers_the_library_plugin_with_core_defaults(run_isolated, cpu_library):
    result = run_isolated(DESCRIBE, {"PJRT_LIBRARY_PATH": cpu_library})
    assert result.returncode == 0 and not result.stderr, result
    assert result.json() == {
        "library": {"path": cpu_library, "options": {}, "priority": 0, "class": "LibraryPlugin"}
    }


def test_jax_names_and_library_paths_registers_each_name(run_isolated, cpu_library, tmp_path):
    other = tmp_path / "libother_pjrt.so"
    other.write_bytes(b"\x7fELF")  # only checked to be a regular file; never opened by discovery
    result = run_isolated(DESCRIBE, {"PJRT_NAMES_AND_LIBRARY_PATHS": f"MyCpu:{cpu_library}, other:{other}"})
    assert result.returncode == 0 and not result.stderr, result
    data = result.json()
    assert data["mycpu"]["path"] == cpu_library
    assert data["other"]["path"] == str(other)


def test_a_json_config_gives_path_and_create_options(run_isolated, cpu_library, tmp_path):
    config = tmp_path / "plugin.json"
    config.write_text(json.dumps({"library_path": cpu_library, "create_options": {"cpu_device_count": 8}}))
    data = run_isolated(DESCRIBE, {"PJRT_NAMES_AND_LIBRARY_PATHS": f"cfg:{config}"}).json()
    assert data["cfg"]["path"] == cpu_library
    assert data["cfg"]["options"] == {"cpu_device_count": 8}


def test_relative_missing_and_non_regular_paths_are_refused_with_a_message(run_isolated, tmp_path):
    env = {
        "PJRT_LIBRARY_PATH": "lib/pjrt.so",
        "PJRT_NAMES_AND_LIBRARY_PATHS": f"adir:{tmp_path},ghost:{tmp_path / 'ghost.so'},garbage",
    }
    result = run_isolated(DESCRIBE, env)
    assert result.returncode == 0, result
    data = result.json()
    assert "PJRT_LIBRARY_PATH names 'library' but library path 'lib/pjrt.so' is not absolute" in data["library"]["error"]
    assert f"library path '{tmp_path}' is not a regular file" in data["adir"]["error"]
    assert "does not exist" in data["ghost"]["error"]
    # Each refusal was also a warning at import, and the unparsable entry is named.
    assert result.stderr.count("PluginWarning") == 4
    assert "entry 'garbage' is not NAME:PATH" in result.stderr


def test_an_environment_library_takes_a_backend_name_with_a_warning(site, run_isolated, plugin_source, cpu_library):
    site.add("cpu-dist", "1.0", modules={"cpumod": plugin_source("Cpu")}, plugins={"cpu": "cpumod:Cpu"})
    result = run_isolated(DESCRIBE, {"PJRT_NAMES_AND_LIBRARY_PATHS": f"cpu:{cpu_library}"})
    assert result.returncode == 0, result
    assert result.json()["cpu"]["class"] == "LibraryPlugin"
    assert "plugin name 'cpu' is offered by environment variable PJRT_NAMES_AND_LIBRARY_PATHS and by cpu-dist 1.0" in (
        result.stderr
    )

"""PJRT_PLUGINS_LOG_LEVEL: the one switch for the plugins' C++ logging, applied before a library opens.

The parsing and the environment it writes are checked in this process; what a real plugin
prints is checked in fresh interpreters (a library reads its variables once, when loaded).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pjrt_plugins import PluginConfigurationError
from pjrt_plugins import _native_logs as native_logs
from pjrt_plugins._native_logs import LOG_LEVEL_ENV, TPU_VARIABLES, XLA_VARIABLES, apply_native_log_settings, parse_log_level

ALL_VARIABLES = (LOG_LEVEL_ENV, *XLA_VARIABLES, *TPU_VARIABLES)
#: The line every client creation of the XLA CPU plugin logs at INFO.
CPU_INFO_LINE = "cpu_device_count set via create_options: 8"


@pytest.fixture
def log_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No logging variable set, and no memory of values written earlier in this process."""
    for name in ALL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(native_logs, "_ours", {})
    return monkeypatch


def fresh_env(**extra: str) -> dict[str, str]:
    """This process's environment without any logging variable (the test process set some), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ALL_VARIABLES}
    env.update(extra)
    return env


def create_cpu_client(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(
        """
        import pjrt_plugins
        with pjrt_plugins.create_client("cpu", {"cpu_device_count": 8}) as client:
            print(len(client.devices))
        """
    )
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("error", (2, None, "")),
        ("ERROR", (2, None, "")),
        ("warning", (1, None, "")),
        ("warn", (1, None, "")),
        ("info", (0, None, "")),
        ("debug", (0, 1, "")),
        ("fatal", (3, None, "")),
        ("critical", (3, None, "")),
        ("info,sharding_propagation=2", (0, None, "sharding_propagation=2")),
        ("warning, cpu_client=3 ,pjrt_c_api_cpu_internal=1", (1, None, "cpu_client=3,pjrt_c_api_cpu_internal=1")),
        ("cpu_client=3", (0, None, "cpu_client=3")),  # VLOG lines are INFO lines: module entries alone mean info
    ],
)
def test_levels_and_module_entries_parse(text, expected):
    assert tuple(parse_log_level(text)) == expected


@pytest.mark.parametrize("text", ["verbose", "info,cpu_client", "info,cpu_client=high", "3", "info,=1"])
def test_a_malformed_switch_names_the_variable_and_the_accepted_forms(text):
    with pytest.raises(PluginConfigurationError, match=r"PJRT_PLUGINS_LOG_LEVEL=.*must be a level \(debug, info"):
        parse_log_level(text)


def test_unset_means_errors_only_for_xla_and_libtpu(log_env):
    written = apply_native_log_settings()
    assert written == {"TF_CPP_MIN_LOG_LEVEL": "2", "TPU_STDERR_LOG_LEVEL": "2", "TPU_MIN_LOG_LEVEL": "2"}
    assert all(os.environ[name] == value for name, value in written.items())
    assert apply_native_log_settings() == {}  # idempotent


def test_the_switch_replaces_the_users_own_variables(log_env):
    log_env.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    log_env.setenv(LOG_LEVEL_ENV, "debug,cpu_client=2")
    apply_native_log_settings()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert os.environ["TF_CPP_MAX_VLOG_LEVEL"] == "1"
    assert os.environ["TF_CPP_VMODULE"] == os.environ["TPU_VMODULE"] == "cpu_client=2"
    assert os.environ["TPU_STDERR_LOG_LEVEL"] == "0"


def test_without_the_switch_a_family_the_user_set_is_left_alone(log_env):
    # A JAX user's TF_CPP_VMODULE keeps working (and our default does not hide its INFO lines);
    # libtpu's family, which the user did not touch, still gets the quiet default.
    log_env.setenv("TF_CPP_VMODULE", "cpu_client=3")
    written = apply_native_log_settings()
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ and os.environ["TF_CPP_VMODULE"] == "cpu_client=3"
    assert written == {"TPU_STDERR_LOG_LEVEL": "2", "TPU_MIN_LOG_LEVEL": "2"}


def test_changing_the_switch_drops_what_the_earlier_one_wrote(log_env):
    log_env.setenv(LOG_LEVEL_ENV, "debug,cpu_client=2")
    apply_native_log_settings()
    log_env.setenv(LOG_LEVEL_ENV, "warning")
    apply_native_log_settings()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
    assert not {"TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE", "TPU_VMODULE"} & set(os.environ)


def test_a_malformed_switch_stops_loading_a_library_with_the_reason(log_env, cpu_library_path):
    from pjrt_plugins.runtime import load_library

    log_env.setenv(LOG_LEVEL_ENV, "loud")
    with pytest.raises(PluginConfigurationError, match="PJRT_PLUGINS_LOG_LEVEL='loud'"):
        load_library(cpu_library_path)


# -- a real plugin, in fresh interpreters -------------------------------------------------------


def test_client_creation_on_the_cpu_plugin_prints_nothing_by_default():
    result = create_cpu_client(fresh_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "8"
    assert result.stderr == ""


@pytest.mark.parametrize("level", ["info", "debug", "pjrt_c_api_cpu_internal=1"])
def test_asking_for_info_shows_the_plugins_info_lines(level):
    result = create_cpu_client(fresh_env(**{LOG_LEVEL_ENV: level}))
    assert result.returncode == 0, result.stderr
    assert CPU_INFO_LINE in result.stderr


def test_module_verbosity_reaches_the_plugin():
    # cpu_client.cc VLOGs its creation at level 1: shown for that module, not at plain info.
    plain = create_cpu_client(fresh_env(**{LOG_LEVEL_ENV: "info"}))
    verbose = create_cpu_client(fresh_env(**{LOG_LEVEL_ENV: "info,cpu_client=1"}))
    assert plain.returncode == verbose.returncode == 0, (plain.stderr, verbose.stderr)
    assert "PjRtCpuClient created" not in plain.stderr
    assert "PjRtCpuClient created" in verbose.stderr


def test_a_users_own_tf_cpp_min_log_level_is_respected():
    result = create_cpu_client(fresh_env(TF_CPP_MIN_LOG_LEVEL="0"))
    assert result.returncode == 0, result.stderr
    assert CPU_INFO_LINE in result.stderr

"""pjrt_plugins.find_library / installed_library: an environment override, else a file of an installed distribution."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import pjrt_plugins
from pjrt_plugins import env_int, find_library, installed_library

ENV = "PJRT_TEST_LOOKUP_LIBRARY_PATH"


@pytest.fixture
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A real (tiny) installed distribution ``fake-pjrt-lib`` on sys.path; returns its would-be library path."""
    site = tmp_path / "site"
    dist_info = site / "fake_pjrt_lib-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-pjrt-lib\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(ENV, raising=False)
    return site / "fake_pjrt_lib" / "libfake_pjrt.so"


def test_the_installed_file_is_found_through_metadata(fake_distribution: Path):
    fake_distribution.parent.mkdir()
    fake_distribution.write_bytes(b"")
    distributions = [("not-installed-pjrt-lib", "x.so"), ("fake-pjrt-lib", "fake_pjrt_lib/libfake_pjrt.so")]
    assert installed_library(distributions) == fake_distribution.absolute()
    assert find_library(ENV, distributions) == str(fake_distribution.absolute())


def test_a_distribution_without_the_file_is_skipped_with_a_warning(fake_distribution: Path, caplog):
    with caplog.at_level(logging.WARNING, logger="pjrt_plugins._library_lookup"):
        assert find_library(ENV, [("fake-pjrt-lib", "fake_pjrt_lib/libfake_pjrt.so")]) is None
    assert "fake-pjrt-lib is installed but fake_pjrt_lib/libfake_pjrt.so is missing" in caplog.text
    assert installed_library([("not-installed-pjrt-lib", "x.so")]) is None


def test_the_environment_override_wins_and_is_made_absolute(fake_distribution: Path, monkeypatch, tmp_path):
    fake_distribution.parent.mkdir()
    fake_distribution.write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "libnewer.so").write_bytes(b"")
    monkeypatch.setenv(ENV, "vendor/libnewer.so")
    found = find_library(ENV, [("fake-pjrt-lib", "fake_pjrt_lib/libfake_pjrt.so")])
    assert found == str(tmp_path / "vendor" / "libnewer.so")
    monkeypatch.setenv("HOME", str(tmp_path / "vendor"))
    monkeypatch.setenv(ENV, "~/libnewer.so")
    assert find_library(ENV, []) == str(tmp_path / "vendor" / "libnewer.so")
    monkeypatch.setenv(ENV, "")  # empty means unset
    assert find_library(ENV, [("fake-pjrt-lib", "fake_pjrt_lib/libfake_pjrt.so")]) == str(fake_distribution.absolute())


@pytest.mark.parametrize("value, what", [("vendor/missing.so", "does not exist"), ("/dev/zero", "is not a regular file")])
def test_a_broken_override_is_a_configuration_error_naming_the_variable(fake_distribution: Path, monkeypatch, tmp_path, value, what):
    fake_distribution.parent.mkdir()
    fake_distribution.write_bytes(b"")  # an installed library exists, and must not be used silently instead
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV, value)
    with pytest.raises(pjrt_plugins.PluginConfigurationError, match=f"{ENV}={value!r} names a PJRT library that {what}"):
        find_library(ENV, [("fake-pjrt-lib", "fake_pjrt_lib/libfake_pjrt.so")])


def test_env_int_is_public_and_names_a_malformed_variable(monkeypatch):
    assert pjrt_plugins.env_int is env_int
    monkeypatch.delenv("PJRT_TEST_COUNT", raising=False)
    monkeypatch.setenv("PJRT_TEST_OTHER", " ")
    assert env_int("PJRT_TEST_COUNT", "PJRT_TEST_OTHER", default=3) == 3
    monkeypatch.setenv("PJRT_TEST_OTHER", "7")
    assert env_int("PJRT_TEST_COUNT", "PJRT_TEST_OTHER", default=3) == 7
    monkeypatch.setenv("PJRT_TEST_COUNT", "many")
    with pytest.raises(ValueError, match="PJRT_TEST_COUNT='many' must be an integer"):
        env_int("PJRT_TEST_COUNT", "PJRT_TEST_OTHER", default=3)

"""Default plugin selection: PJRT_DEVICE first, else the highest-priority available plugin."""

from __future__ import annotations

import pytest

SELECT = """
import json, pjrt_plugins as p
try:
    print(json.dumps({"default": p.default_plugin().name}))
except p.PjrtPluginsError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


@pytest.fixture
def three_plugins(site, plugin_source):
    site.add("low-dist", "1.0", modules={"low": plugin_source("Low", priority=0)}, plugins={"low": "low:Low"})
    site.add("mid-dist", "1.0", modules={"mid": plugin_source("Mid", priority=50)}, plugins={"mid": "mid:Mid"})
    # The highest priority, but no hardware here (physical_chip_count() == 0).
    site.add("top-dist", "1.0", modules={"top": plugin_source("Top", priority=300, chips=0)}, plugins={"top": "top:Top"})


def test_without_pjrt_device_the_highest_priority_available_plugin_wins(three_plugins, run_isolated):
    result = run_isolated(SELECT)
    assert result.json() == {"default": "mid"}, result


def test_pjrt_device_picks_the_plugin_in_any_case(three_plugins, run_isolated):
    assert run_isolated(SELECT, {"PJRT_DEVICE": "LOW"}).json() == {"default": "low"}
    assert run_isolated(SELECT, {"PJRT_DEVICE": " Low "}).json() == {"default": "low"}


def test_pjrt_device_is_honoured_even_for_an_unavailable_plugin(three_plugins, run_isolated):
    assert run_isolated(SELECT, {"PJRT_DEVICE": "top"}).json() == {"default": "top"}


def test_unknown_pjrt_device_raises_listing_installed_plugins(three_plugins, run_isolated):
    data = run_isolated(SELECT, {"PJRT_DEVICE": "TPUX"}).json()
    assert data["error"] == "PluginNotFoundError"
    assert "PJRT_DEVICE='TPUX'" in data["message"]
    assert "Installed plugins: low, mid, top" in data["message"]


def test_equal_priorities_go_to_the_alphabetically_first_name(site, run_isolated, plugin_source):
    site.add("b-dist", "1.0", modules={"bmod": plugin_source("B", priority=7)}, plugins={"bbb": "bmod:B"})
    site.add("a-dist", "1.0", modules={"amod": plugin_source("A", priority=7)}, plugins={"aaa": "amod:A"})
    assert run_isolated(SELECT).json() == {"default": "aaa"}


def test_when_no_plugin_is_available_the_error_lists_each_reason(site, run_isolated, plugin_source):
    site.add("top-dist", "1.0", modules={"top": plugin_source("Top", chips=0)}, plugins={"top": "top:Top"})
    site.add(
        "gone-dist",
        "1.0",
        modules={"gone": plugin_source("Gone", library="'/nonexistent/libgone.so'")},
        plugins={"gone": "gone:Gone"},
    )
    site.add("bad-dist", "1.0", modules={"bad": "raise ImportError('no')"}, plugins={"bad": "bad:X"})
    data = run_isolated(SELECT).json()
    assert data["error"] == "PluginUnavailableError"
    message = data["message"]
    assert "top: no devices of this kind were found on this host" in message
    assert "gone: its library '/nonexistent/libgone.so' does not exist" in message
    assert "bad: failed to load" in message
    assert "set PJRT_DEVICE" in message


def test_with_no_plugin_installed_the_error_says_what_to_install(run_isolated):
    data = run_isolated(SELECT).json()
    assert data["error"] == "PluginNotFoundError"
    assert "no PJRT plugins are installed" in data["message"] and "PJRT_LIBRARY_PATH" in data["message"]


def test_create_client_uses_the_named_or_the_default_plugin(run_installed, cpu_library):
    code = """
        import json, pjrt_plugins as p
        with p.create_client("LIBRARY", {"cpu_device_count": 3}) as named:
            first = [named.platform_name, len(named.devices)]
        with p.create_client() as default:
            second = [default.platform_name, len(default.devices)]
        print(json.dumps([first, second]))
        """
    result = run_installed(code, {"PJRT_LIBRARY_PATH": cpu_library, "PJRT_DEVICE": "library"})
    assert result.returncode == 0, result
    first, second = result.json()
    assert first == ["cpu", 3]
    assert second[0] == "cpu" and second[1] >= 1

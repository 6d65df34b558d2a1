"""The core owns what follows from a missing library: unavailable with the backend's hint, and no
client (a preflight refusal) before any backend check runs. Backends state only the hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from pjrt_plugins import DevicePlugin, PluginUnavailableError, hookimpl
from pjrt_plugin_cpu import CpuPlugin
from pjrt_plugin_gpu import GpuPlugin
from pjrt_plugin_stub_neuron import StubNeuronPlugin
from pjrt_plugin_tpu import TpuPlugin


class Recording(DevicePlugin):
    """A backend whose library is wherever the test says, logging which of its checks ran."""

    def __init__(self, library: str | None, hint: str | None = None) -> None:
        super().__init__()
        self.name = "recording"
        self.library = library
        self.hint = hint
        self.ran: list[str] = []

    @hookimpl
    def pjrt_library_path(self) -> str | None:
        return self.library

    @hookimpl
    def pjrt_library_missing_hint(self) -> str | None:
        return self.hint

    @hookimpl
    def pjrt_unavailable_reason(self) -> str | None:
        self.ran.append("unavailable_reason")
        return "no recording hardware here"

    @hookimpl
    def pjrt_preflight(self) -> None:
        self.ran.append("preflight")


class LibraryGone:
    """A site override naming a library file that is not there (a package whose library went missing;
    an override cannot answer None: for pluggy that means "ask the backend")."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @hookimpl
    def pjrt_library_path(self) -> str:
        return str(self.path)


def test_a_missing_library_makes_the_plugin_unavailable_with_the_backend_hint_first():
    plugin = Recording(None, hint="run `pip install recording-pjrt` or set RECORDING_LIBRARY_PATH")
    reason = plugin.unavailable_reason()
    assert reason == (
        "its PJRT library could not be found; run `pip install recording-pjrt` or set RECORDING_LIBRARY_PATH"
    )
    assert plugin.ran == []  # the backend's own checks may assume a library
    with pytest.raises(PluginUnavailableError, match="^plugin 'recording': its PJRT library could not be found; run"):
        plugin.preflight()
    assert plugin.ran == []
    with pytest.raises(PluginUnavailableError, match="pip install recording-pjrt"):
        plugin.library_path()


def test_a_library_path_with_no_file_behind_it_is_missing_too(tmp_path: Path):
    plugin = Recording(str(tmp_path / "librecording.so"), hint="reinstall recording")
    assert plugin.unavailable_reason() == f"its library {str(tmp_path / 'librecording.so')!r} does not exist; reinstall recording"
    with pytest.raises(PluginUnavailableError, match="does not exist; reinstall recording"):
        plugin.create_client()
    assert plugin.ran == []


def test_without_a_hint_the_core_says_to_reinstall_the_distribution():
    plugin = Recording(None)
    plugin.distribution = "pjrt-plugin-recording"
    assert plugin.unavailable_reason() == (
        "its PJRT library could not be found; reinstall the plugin package (pjrt-plugin-recording) or set the "
        "library path its documentation names"
    )


def test_with_the_library_there_the_backend_checks_run(cpu_library_path: Path):
    plugin = Recording(str(cpu_library_path))
    assert plugin.unavailable_reason() == "no recording hardware here"
    plugin.preflight()
    assert plugin.ran == ["unavailable_reason", "preflight"]


@pytest.mark.parametrize(
    "backend, hint",
    [
        (CpuPlugin, "run `pip install xla-cpu-pjrt` or set PJRT_CPU_LIBRARY_PATH"),
        (GpuPlugin, "`pip install 'pjrt-plugin-gpu[cuda13]'`"),
        (TpuPlugin, "run `pip install libtpu` or set TPU_LIBRARY_PATH to libtpu.so"),
        (StubNeuronPlugin, "reinstall pjrt-plugin-stub-neuron from source"),
    ],
)
def test_each_reference_backend_states_only_its_hint(backend: type[DevicePlugin], hint: str, tmp_path: Path):
    """The real backends whose library is gone: the core's words, each one's fix."""
    plugin = backend()
    plugin.name = "backend"
    plugin.add_override(LibraryGone(tmp_path / "gone.so"))
    reason = plugin.unavailable_reason()
    assert reason is not None and reason.startswith(f"its library {str(tmp_path / 'gone.so')!r} does not exist; ")
    assert hint in reason
    with pytest.raises(PluginUnavailableError, match="does not exist") as raised:
        plugin.preflight()
    assert hint in str(raised.value)

"""The registry's own rules, in process: canonical names, what register_plugin accepts, lookups."""

from __future__ import annotations

import warnings

import pytest

import pjrt_plugins
from pjrt_plugins import DevicePlugin, PluginNotFoundError, canonical_name, hookimpl
from pjrt_plugins._torch_xla import TorchXlaStylePlugin


class Cpuish(DevicePlugin):
    @hookimpl
    def pjrt_library_path(self):
        return __file__

    @hookimpl
    def pjrt_priority(self):
        return 11


@pytest.mark.parametrize(
    "raw, canonical",
    [("CPU", "cpu"), (" Tpu ", "tpu"), ("stub_neuron", "stub-neuron"), ("STUB-NEURON", "stub-neuron"),
     ("a.b-c", "a-b-c"), ("a_-_b", "a-b"), ("ｓｔｕｂ＿ｎｅｕｒｏｎ", "stub-neuron")],
)
def test_canonical_name_is_stripped_lower_case_and_dash_separated(raw, canonical):
    # As PEP 503 for distributions: '-', '_' and '.' spell one separator, written '-' (the one
    # PyTorch/XLA's PJRT_DEVICE can carry).
    assert canonical_name(raw) == canonical


def test_every_spelling_of_a_name_reaches_one_plugin_and_pjrt_device_too(clean_registry, monkeypatch):
    plugin = pjrt_plugins.register_plugin("core_test_dev", Cpuish)
    assert plugin.name == "core-test-dev"
    assert {r.name for r in pjrt_plugins.plugin_records()} >= {"core-test-dev"}
    assert "core_test_dev" not in {r.name for r in pjrt_plugins.plugin_records()}
    for spelling in ("core_test_dev", "CORE-TEST-DEV", "Core.Test_Dev", "core-test-dev"):
        assert pjrt_plugins.get_plugin(spelling) is plugin, spelling
        monkeypatch.setenv("PJRT_DEVICE", spelling.upper())
        assert pjrt_plugins.default_plugin() is plugin, spelling
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a '_' here reaches PyTorch/XLA nowhere: nothing to warn about
        other = pjrt_plugins.register_plugin("core_test_other", Cpuish)
    assert other.name == "core-test-other"
    with pytest.warns(pjrt_plugins.PluginWarning, match="replaces the plugin"):  # the same name, spelt otherwise
        pjrt_plugins.register_plugin("CORE-TEST-DEV", Cpuish)


@pytest.mark.parametrize("bad", ["", "   ", "my dev", "cpu:1", "a,b", "x=y", "a/b"])
def test_canonical_name_refuses_names_that_cannot_round_trip_through_the_environment(bad):
    with pytest.raises(ValueError, match="invalid plugin name"):
        canonical_name(bad)


def test_register_plugin_accepts_a_class_an_instance_or_a_torch_xla_style_object(clean_registry):
    from_class = pjrt_plugins.register_plugin("Core-Test-A", Cpuish)
    assert isinstance(from_class, Cpuish) and from_class.name == "core-test-a"
    instance = Cpuish()
    assert pjrt_plugins.register_plugin("core-test-b", instance) is instance

    class TorchXlaStyle:
        def library_path(self):
            return "/opt/x/libx.so"

    adapted = pjrt_plugins.register_plugin("core-test-c", TorchXlaStyle())
    assert isinstance(adapted, TorchXlaStylePlugin)
    assert adapted.hook.pjrt_library_path() == "/opt/x/libx.so"
    assert pjrt_plugins.get_plugin("CORE-TEST-A") is from_class
    registered = pjrt_plugins.registered_plugins()
    assert [n for n in registered if n.startswith("core-test")] == ["core-test-a", "core-test-b", "core-test-c"]
    records = {r.name: r for r in pjrt_plugins.plugin_records()}
    assert records["core-test-a"].origin == "register_plugin()" and records["core-test-a"].status == "loaded"


def test_register_plugin_refuses_what_is_not_a_plugin(clean_registry):
    with pytest.raises(TypeError, match="expected a pjrt_plugins.DevicePlugin"):
        pjrt_plugins.register_plugin("core-test-junk", object())
    with pytest.raises(PluginNotFoundError):
        pjrt_plugins.get_plugin("core-test-junk")


def test_replacing_a_registered_name_warns_unless_asked_explicitly(clean_registry):
    first = pjrt_plugins.register_plugin("core-test-dup", Cpuish)
    with pytest.warns(pjrt_plugins.PluginWarning, match=r"register_plugin\('CORE-TEST-DUP'\) replaces the plugin"):
        second = pjrt_plugins.register_plugin("CORE-TEST-DUP", Cpuish())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        third = pjrt_plugins.register_plugin("core-test-dup", Cpuish(), replace=True)
        assert pjrt_plugins.register_plugin("core-test-dup", third) is third  # same object: no-op
    assert pjrt_plugins.get_plugin("core-test-dup") is third and third is not second is not first
    record = [r for r in pjrt_plugins.plugin_records() if r.name == "core-test-dup"][0]
    assert [s.plugin for s in record.shadowed] == [second]


def test_get_plugin_of_an_unknown_name_lists_what_is_installed(clean_registry):
    pjrt_plugins.register_plugin("core_test_known", Cpuish)
    # The error repeats the name as the caller spelt it, and lists the installed ones as they are listed.
    with pytest.raises(PluginNotFoundError, match=r"no PJRT plugin named 'Core_Test_Unknown'\. Installed plugins: .*core-test-known"):
        pjrt_plugins.get_plugin(" Core_Test_Unknown ")
    assert isinstance(PluginNotFoundError("x"), LookupError)  # catchable as a lookup failure too


def test_our_hookimpl_marks_exactly_as_pluggys_marker_and_knows_every_hook():
    import pluggy

    from pjrt_plugins import _marker, hookspecs

    reference = pluggy.HookimplMarker(hookspecs.PROJECT_NAME)
    variants = [{}, {"tryfirst": True}, {"trylast": True, "specname": "pjrt_priority"}, {"wrapper": True}, {"optionalhook": True}]
    for options in variants:
        ours = _marker.hookimpl(**options)(lambda self: None)
        theirs = reference(**options)(lambda self: None)
        assert getattr(ours, _marker.IMPL_ATTRIBUTE) == getattr(theirs, _marker.IMPL_ATTRIBUTE)
    bare = _marker.hookimpl(lambda self: None)
    assert getattr(bare, _marker.IMPL_ATTRIBUTE) == getattr(reference(lambda self: None), _marker.IMPL_ATTRIBUTE)
    specs = {name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), hookspecs.PROJECT_NAME + "_spec")}
    assert _marker.HOOK_NAMES == specs
    assert pjrt_plugins.hookimpl is _marker.hookimpl and pjrt_plugins.hookspec is hookspecs.hookspec

"""Layering one hook over one backend: entry points in `pjrt_plugins.overrides`, and add_override()."""

from __future__ import annotations

import pluggy
import pytest

import pjrt_plugins
from pjrt_plugins import DevicePlugin, hookimpl

ANSWERS = """
import json, pjrt_plugins as p
print(json.dumps({name: [pl.dense_gather_factor(), pl.rng_default()] for name, pl in p.registered_plugins().items()}))
"""

SITE_POLICY = """
from pjrt_plugins import hookimpl

class DenseGathers:
    @hookimpl
    def pjrt_dense_gather_factor(self):
        return 4096

class Philox:
    @hookimpl
    def pjrt_rng_default(self):
        return "philox"

class Nothing:
    pass
"""


@pytest.fixture
def two_backends(site, plugin_source):
    site.add("tpu-dist", "1.0", modules={"tpumod": plugin_source("Tpu")}, plugins={"tpu": "tpumod:Tpu"})
    site.add("gpu-dist", "1.0", modules={"gpumod": plugin_source("Gpu")}, plugins={"gpu": "gpumod:Gpu"})


def test_an_override_entry_point_changes_one_hook_of_one_backend_only(two_backends, site, run_isolated):
    site.add("site-policy", "1.0", modules={"site_policy": SITE_POLICY}, overrides={"TPU": "site_policy:DenseGathers"})
    result = run_isolated(ANSWERS)
    assert result.returncode == 0 and not result.stderr, result
    assert result.json() == {"gpu": [0, "default"], "tpu": [4096, "default"]}


def test_a_star_override_applies_to_every_backend(two_backends, site, run_isolated):
    site.add("site-policy", "1.0", modules={"site_policy": SITE_POLICY}, overrides={"*": "site_policy:Philox"})
    assert run_isolated(ANSWERS).json() == {"gpu": [0, "philox"], "tpu": [0, "philox"]}


def test_a_broken_override_warns_and_the_backend_keeps_working(two_backends, site, run_isolated):
    site.add(
        "site-policy",
        "2.0",
        modules={"site_policy": SITE_POLICY},
        overrides={"tpu": "site_policy:Missing", "gpu": "site_policy:Nothing"},
    )
    result = run_isolated(ANSWERS)
    assert result.returncode == 0, result
    assert result.json() == {"gpu": [0, "default"], "tpu": [0, "default"]}
    assert "override tpu = site_policy:Missing from site-policy 2.0 was not applied to plugin 'tpu'" in result.stderr
    assert "has no @pjrt_plugins.hookimpl methods" in result.stderr


class Base(DevicePlugin):
    @hookimpl
    def pjrt_dense_gather_factor(self):
        return 8192


def test_add_override_answers_first_and_remove_override_restores_the_backend():
    plugin = Base()

    class Site:
        @hookimpl
        def pjrt_dense_gather_factor(self):
            return 100

    class NoOpinion:
        @hookimpl
        def pjrt_dense_gather_factor(self):
            return None  # "ask the next one"

    override = plugin.add_override(Site())
    assert plugin.dense_gather_factor() == 100
    other = Base()
    assert other.dense_gather_factor() == 8192  # another backend object never sees it
    plugin.add_override(NoOpinion())
    assert plugin.dense_gather_factor() == 100
    plugin.remove_override(override)
    assert plugin.dense_gather_factor() == 8192


def test_add_override_refuses_objects_without_hooks_and_misspelt_hooks():
    plugin = Base()

    class Typo:
        @hookimpl
        def pjrt_dense_gather_factr(self):
            return 1

    with pytest.raises(TypeError, match="no @pjrt_plugins.hookimpl methods"):
        plugin.add_override(object())
    with pytest.raises(pluggy.PluginValidationError, match="unknown hook 'pjrt_dense_gather_factr'"):
        plugin.add_override(Typo())
    assert plugin.dense_gather_factor() == 8192  # neither was left registered
    assert pjrt_plugins.DevicePlugin  # (the public name stays importable)

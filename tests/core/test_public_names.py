"""The package's public names: every exception type of pjrt_plugins.errors is importable from pjrt_plugins."""

from __future__ import annotations

import inspect

import pjrt_plugins
from pjrt_plugins import errors


def test_every_error_and_warning_type_is_exported_from_the_package():
    defined = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    }
    assert "PjrtPluginsError" in defined and "DistributedSetupError" in defined
    for name in sorted(defined):
        assert getattr(pjrt_plugins, name) is getattr(errors, name), name
    assert defined <= set(pjrt_plugins.__all__)


def test_every_name_in_all_resolves():
    for name in pjrt_plugins.__all__:
        assert getattr(pjrt_plugins, name) is not None, name

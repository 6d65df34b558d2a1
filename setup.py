"""pjrt-plugins' one native part, which pyproject.toml can declare only in an experimental table.

The runtime's fast path, ``core/pjrt_plugins/runtime/csrc/fastpath.c``, is compiled into a plain
shared library (no Python API) by ``pjrt_plugins.runtime._build_fastpath``, the ``build_ext``
named in pyproject.toml, where the rest of the metadata is.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("pjrt_plugins.runtime.libpjrt_plugins_fastpath", ["core/pjrt_plugins/runtime/csrc/fastpath.c"]),
    ]
)

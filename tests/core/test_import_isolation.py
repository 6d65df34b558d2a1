"""`import pjrt_plugins` opens no PJRT library and imports neither torch, jaxlib, numpy nor cffi."""

from __future__ import annotations

HEAVY = ("torch", "jax", "jaxlib", "numpy", "cffi", "_cffi_backend", "torch_xla", "ml_dtypes")

CHECK = """
import json, sys, ctypes, pjrt_plugins as p

def mapped():
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if "/" in line}

libraries = {}
for record in p.plugin_records():
    if record.plugin is not None:
        try:
            libraries[record.name] = str(record.plugin.hook.pjrt_library_path())
        except Exception as exc:
            libraries[record.name] = repr(exc)
before = mapped()
out = {
    "plugins": sorted(libraries),
    "mapped_plugin_libraries": sorted(n for n, path in libraries.items() if path in before),
    "pjrt_like": sorted(m for m in before if "pjrt" in m.lower() or "libtpu" in m or "cuda" in m),
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in %r),
}
# Positive control: opening the library does show up in the same check.
ctypes.CDLL(libraries["library"], mode=ctypes.RTLD_GLOBAL)
out["control_mapped"] = libraries["library"] in mapped()
print(json.dumps(out))
""" % (HEAVY,)


def test_no_pjrt_library_is_mapped_and_nothing_heavy_is_imported_with_everything_installed(
    run_installed, cpu_library
):
    # The whole development environment: the reference backends, libtpu, the CUDA and CPU plugin wheels.
    result = run_installed(CHECK, {"PJRT_LIBRARY_PATH": cpu_library})
    assert result.returncode == 0, result
    data = result.json()
    assert "library" in data["plugins"]
    assert data["mapped_plugin_libraries"] == []
    assert data["pjrt_like"] == []
    assert data["heavy"] == []
    assert data["control_mapped"] is True


def test_importing_the_package_imports_no_plugin_runtime_modules(run_isolated, cpu_library):
    result = run_isolated(
        """
        import json, sys, pjrt_plugins
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("pjrt_plugins"))))
        """,
        {"PJRT_LIBRARY_PATH": cpu_library},
    )
    assert result.returncode == 0, result
    loaded = result.json()
    assert "pjrt_plugins._registry" in loaded
    assert not [m for m in loaded if m.startswith(("pjrt_plugins.runtime", "pjrt_plugins.spmd", "pjrt_plugins.cli"))]

"""The development environment scripts/setup makes: quiet for JAX, yet the gpu tests use the real CUDA library.

scripts/setup keeps the gpu backend's [cuda13-local] wheels in a site directory of their own
(``_support.CUDA_SITE``), which the test session adds to its path: in the environment's
site-packages, JAX would find a CUDA plugin it cannot use on this machine and print
"Jax plugin configuration error" on every ``jax.devices()``.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pjrt_plugins
from _support import CUDA_SITE
from pjrt_plugin_gpu._devices import installed_gpu_count
from pjrt_plugin_tpu import count_tpu_chips

#: What a developer's shell may hold that the environment itself does not.
SHELL_ONLY = ("PYTHONPATH", "JAX_", "PJRT_", "TPU_", "TF_CPP_", "XLA_", "CUDA_VISIBLE_DEVICES")


def plain_python(code: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in the development environment as a developer has it (no test-session paths)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SHELL_ONLY)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)


def test_the_cuda_wheels_are_in_their_own_site_directory_and_the_gpu_backend_uses_them():
    distribution = importlib.metadata.distribution("jax-cuda13-pjrt")
    assert Path(str(distribution.locate_file(""))).resolve() == CUDA_SITE.resolve()
    assert importlib.metadata.distribution("jax-cuda13-plugin").version == distribution.version
    library = Path(pjrt_plugins.get_plugin("gpu").library_path())
    assert library.is_relative_to(CUDA_SITE) and library.name == "xla_cuda_plugin.so"


def test_the_environment_itself_has_no_jax_visible_cuda_plugin():
    # find_spec of a submodule raises when its parent package is absent (a fresh environment has no jax_plugins)
    result = plain_python(
        "import importlib.util as u\n"
        "def find(name):\n"
        "    try:\n"
        "        return u.find_spec(name)\n"
        "    except ModuleNotFoundError:\n"
        "        return None\n"
        "print(find('jax_plugins.xla_cuda13'), find('jax_cuda13_plugin'))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None None"


def test_a_plain_jax_devices_prints_no_plugin_error():
    result = plain_python("import jax; print(jax.devices())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[CpuDevice(id=0)]"
    for text in ("Jax plugin configuration error", "Traceback", "cuda_plugin_extension", "Unable to initialize backend",
                 "could not determine TPU", "E0000"):
        assert text not in result.stderr, result.stderr[-3000:]
    if installed_gpu_count() == 0 and count_tpu_chips() == 0:
        assert result.stderr == ""  # JAX may mention hardware it sees; with none, nothing at all

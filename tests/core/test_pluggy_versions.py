"""The oldest pluggy the core declares (``pluggy>=1.3``), and the last that ran properties when registering.

Before pluggy 1.7, ``register`` read every attribute of a plugin with ``getattr``; a DevicePlugin's
``hook`` property builds the very manager being registered, so every backend recursed until
RecursionError. Found on a GPU machine whose image had pluggy 1.6.0. These install those pluggy
releases from the package index into a folder of their own and run the installed backends with them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

#: The lower bound in pyproject.toml, and the newest release without static hook lookup.
OLD_PLUGGY = ("1.3.0", "1.6.0")

CHECK = textwrap.dedent(
    """
    import json, numpy as np, pluggy, pjrt_plugins
    from pjrt_plugins import hookimpl
    from pjrt_plugins.conform._programs import ADD_F32

    class Philox:
        @hookimpl
        def pjrt_rng_default(self):
            return "philox"

    answers = {}
    for name, plugin in sorted(pjrt_plugins.registered_plugins().items()):
        answers[name] = [plugin.priority(), plugin.unavailable_reason() is None, plugin.rng_default()]
    cpu = pjrt_plugins.get_plugin("cpu")
    cpu.add_override(Philox())
    with cpu.create_client({"cpu_device_count": 2}) as client:
        ones = client.buffer_from_host(np.ones(4, np.float32))
        [[out]] = client.compile(ADD_F32).execute([[ones, ones]])
        total = out.to_numpy().tolist()
    print(json.dumps({"pluggy": pluggy.__version__, "answers": answers, "override": cpu.rng_default(), "add": total}))
    """
)


@pytest.fixture(scope="module", params=OLD_PLUGGY)
def old_pluggy(request, tmp_path_factory):
    target = tmp_path_factory.mktemp(f"pluggy-{request.param}")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-deps",
         "--target", str(target), f"pluggy=={request.param}"],
        capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, f"could not install pluggy {request.param} from the index: {install.stderr[-2000:]}"
    return request.param, target


def _with(target, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=240, env=env)


def test_every_backend_answers_and_runs_a_program(old_pluggy):
    version, target = old_pluggy
    run = _with(target, "-c", CHECK)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.splitlines()[-1])
    assert report["pluggy"] == version
    assert {"cpu", "gpu", "tpu", "stub-neuron"} <= set(report["answers"])
    assert report["answers"]["cpu"] == [0, True, "default"]
    assert report["override"] == "philox"
    assert report["add"] == [2.0, 2.0, 2.0, 2.0]


def test_the_listing_shows_no_hook_errors(old_pluggy):
    version, target = old_pluggy
    run = _with(target, "-m", "pjrt_plugins", "list")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Error" not in run.stdout, run.stdout
    assert "cpu" in run.stdout and "gpu" in run.stdout

"""Mistakes at the edges of the torch frontend give an error that says what is wrong, not one from internals.

``PJRT_DEVICE`` naming no installed plugin fails at the first op with the devices layer's one-line error (the
one ``pjrt-plugins devices`` prints), without the engine's frames; ``torch.compile`` takes tensors with no
elements; a compiled function given pjrt and CPU tensors names those devices (not ``meta``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import pjrt_plugins.spmd as xs  # noqa: F401 - registers the pjrt device

from _exec_support import assert_close, engine  # noqa: F401

FIRST_USE = textwrap.dedent("""
    import torch
    import pjrt_plugins.spmd as xs
    x = torch.ones(3).to("pjrt")
    (x + 1).cpu()
""")


def test_an_unknown_pjrt_device_fails_at_the_first_op_with_the_clis_error():
    env = {**os.environ, "PJRT_DEVICE": "no-such-device"}
    proc = subprocess.run([sys.executable, "-c", FIRST_USE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    cli = subprocess.run([sys.executable, "-m", "pjrt_plugins", "devices"], capture_output=True, text=True, env=env,
                         timeout=300)
    cli_line = cli.stderr.strip().splitlines()[-1]
    message = cli_line.split("PluginNotFoundError: ", 1)[1]
    assert message.startswith("PJRT_DEVICE='no-such-device': no PJRT plugin named 'no-such-device'"), cli_line
    assert f"pjrt_plugins.errors.PluginNotFoundError: {message}" in proc.stderr
    if sys.version_info >= (3, 11):  # exception notes
        assert "the first use of the pjrt device" in proc.stderr
    frames = [line for line in proc.stderr.splitlines() if line.lstrip().startswith("File ")]
    assert len(frames) <= 3, "the traceback goes through the engine:\n" + proc.stderr
    for layer in ("trace", "transport", "execution", "devices"):
        assert f"spmd{os.sep}{layer}{os.sep}" not in proc.stderr, proc.stderr




@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_functions_take_tensors_with_no_elements(engine, fresh_dynamo, dynamic):
    def f(a, b):
        return a * 2 + 1, (a @ b).sum(0), a[:, 1:]

    compiled = torch.compile(f, backend="pjrt", dynamic=dynamic)
    for rows in (0, 3):
        a, b = torch.randn(rows, 3), torch.randn(3, 2)
        for k, (got, want) in enumerate(zip(compiled(a.to("pjrt"), b.to("pjrt")), f(a, b))):
            assert_close(f"{rows} rows, output {k}", got.cpu(), want)


def test_a_zero_size_input_trains(engine, fresh_dynamo):
    w = torch.randn(3, 2)
    wp = w.to("pjrt").requires_grad_()
    loss = torch.compile(lambda x, w: (x @ w).sum() + (w * w).sum(), backend="pjrt")(torch.zeros(0, 3).to("pjrt"), wp)
    loss.backward()
    assert_close("gradient", wp.grad.cpu(), 2 * w)


def test_pjrt_and_cpu_tensors_in_a_compiled_function_name_both_devices(engine, fresh_dynamo):
    compiled = torch.compile(lambda a, b: a * 2 + b, backend="pjrt")
    with pytest.raises(Exception, match=r"found at least two devices, pjrt:0 and cpu!.*move it to the pjrt device") \
            as error:
        compiled(torch.ones(3).to("pjrt"), torch.ones(3))
    assert "meta" not in str(error.value).split("Hint")[0].replace("XLAShardedTensor", "")
    ok = compiled(torch.ones(3).to("pjrt"), torch.ones(3).to("pjrt"))
    assert_close("both on pjrt", ok.cpu(), torch.full((3,), 3.0))

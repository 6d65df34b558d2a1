"""An error inside a built-in backward formula is a Python exception, never a process death.

torch hands ``__torch_dispatch__`` errors to C++ with the Python error still set, and autograd's
engine unwinds through the ``pjrt`` device's Python stream guard, whose ``noexcept`` destructor
calls into Python: before the fix that aborted the process (``terminate called without an
active exception``). The failing op here reads a tensor whose buffers belong to a replaced
virtual device, an error that no lowering can remove. Each case runs in a child process, since
the failure mode is a crash; ops with one result, a tuple and a list of results, each with
autograd's device threads on and off.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent('''
    import sys, torch, torch.nn.functional as F
    import pjrt_plugins.spmd as xs
    from pjrt_plugins.errors import VirtualDeviceError
    from pjrt_plugins.spmd.devices import _virtual_device

    xs.set_plugin("cpu", options={"cpu_device_count": 8})

    def on_devices(*shape):
        t = torch.randn(*shape).to("pjrt") * 1.5
        t.cpu()
        return t

    def stale(*shape):
        """A tensor on the devices of a virtual device that is then replaced."""
        t = on_devices(*shape)
        _virtual_device._replace_current()
        return t

    def one_result():                      # MulBackward0: grad * w
        x = torch.randn(4, 3).to("pjrt").requires_grad_()
        y = x * torch.randn(4, 3).to("pjrt")
        torch.autograd.grad(y, [x], stale(4, 3))

    def tuple_result():                    # native_layer_norm_backward: three results
        x = torch.randn(4, 3).to("pjrt").requires_grad_()
        torch.autograd.grad(F.layer_norm(x, (3,)), [x], stale(4, 3))

    def list_result():                     # StackBackward0: unbind, a list of results
        a, b = (torch.randn(3).to("pjrt").requires_grad_() for _ in range(2))
        torch.autograd.grad(torch.stack([a, b]), [a, b], stale(2, 3))

    def loss_backward():                   # the weight of MulBackward0 goes stale after the forward
        x = torch.randn(4, 3).to("pjrt").requires_grad_()
        loss = (x * on_devices(4, 3)).sum()
        _virtual_device._replace_current()
        loss.backward()

    for threads in (True, False):
        with torch.autograd.set_multithreading_enabled(threads):
            for case in (one_result, tuple_result, list_result, loss_backward):
                try:
                    case()
                    print(case.__name__, threads, "no error")
                except VirtualDeviceError as exc:
                    noted = any("autograd's backward" in n for n in getattr(exc, "__notes__", []))
                    print(case.__name__, threads, "VirtualDeviceError", "noted" if noted else "no note")
                try:
                    xs.sync()  # drop the failed case's pending work (its inputs are on the replaced device)
                except VirtualDeviceError:
                    pass
    print("survived")
''')


@pytest.fixture(scope="module")
def child_output() -> str:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the process died ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-2000:]}"
    return proc.stdout


@pytest.mark.parametrize("threads", [True, False], ids=["device-threads", "calling-thread"])
@pytest.mark.parametrize("case", ["one_result", "tuple_result", "list_result", "loss_backward"])
def test_backward_error_is_the_original_exception_naming_the_op(child_output, case, threads):
    line = next((ln for ln in child_output.splitlines() if ln.startswith(f"{case} {threads} ")), None)
    assert line == f"{case} {threads} VirtualDeviceError noted", child_output


def test_the_process_survives_every_case(child_output):
    assert child_output.rstrip().endswith("survived")

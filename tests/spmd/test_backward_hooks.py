"""An error raised by a hook on a pjrt tensor during backward is a Python exception, never a process death.

torch throws a hook's error into autograd's C++ with the Python error still set, and the engine unwinds
through the ``pjrt`` device's Python stream guard, which cannot run then: before the fix any error in a
tensor hook (``KeyboardInterrupt`` included) aborted the process (``terminate called without an active
exception``). ``loss.backward()`` raises the hook's own exception, as on the CPU; ``torch.autograd.grad``
raises torch's RuntimeError naming it. Each case runs in a child process, since the failure mode is a crash.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent('''
    import sys, torch
    import pjrt_plugins.spmd as xs

    class Stop(BaseException):
        pass

    ERRORS = {"KeyboardInterrupt": KeyboardInterrupt("stop"), "ValueError": ValueError("bad"),
              "SystemExit": SystemExit(3), "Stop": Stop("mine")}

    def run(device, kind, where, threads, call):
        error = ERRORS[kind]

        def hook(*args):
            raise error

        x = torch.ones(3).to(device).requires_grad_()
        with torch.autograd.set_multithreading_enabled(threads):
            if where == "tensor":
                y = x * 4
                y.register_hook(hook)
            elif where == "leaf":
                x.register_hook(hook)
                y = x * 4
            else:  # post-accumulate: after the gradient lands in x.grad
                x.register_post_accumulate_grad_hook(hook)
                y = x * 4
            loss = y.sum()
            try:
                if call == "backward":
                    loss.backward()
                else:
                    torch.autograd.grad(loss, [x])
                return "no error"
            except BaseException as exc:
                return f"{type(exc).__name__}: {exc}"

    for device in ("cpu", "pjrt"):
        for kind in ERRORS:
            for where in ("tensor", "leaf", "post"):
                for threads in (True, False):
                    for call in ("backward", "grad"):
                        if where == "post" and call == "grad":
                            continue  # grad() accumulates nothing
                        print(device, kind, where, threads, call, "->", run(device, kind, where, threads, call))
    x = torch.ones(3).to("pjrt").requires_grad_()
    (x * x).sum().backward()
    print("after", x.grad.cpu().tolist())
''')


@pytest.fixture(scope="module")
def child_lines() -> dict[tuple[str, ...], str]:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the process died ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    lines = {}
    for line in proc.stdout.splitlines():
        head, _, result = line.partition(" -> ")
        lines[tuple(head.split())] = result
    return lines


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "ValueError", "SystemExit", "Stop"])
@pytest.mark.parametrize("where", ["tensor", "leaf", "post"])
@pytest.mark.parametrize("threads", ["True", "False"])
def test_backward_raises_the_hooks_exception_as_on_the_cpu(child_lines, kind, where, threads):
    cpu = child_lines[("cpu", kind, where, threads, "backward")]
    pjrt = child_lines[("pjrt", kind, where, threads, "backward")]
    assert cpu.split(":")[0] == kind, cpu
    assert pjrt == cpu


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "ValueError"])
@pytest.mark.parametrize("where", ["tensor", "leaf"])
def test_autograd_grad_names_the_hooks_exception(child_lines, kind, where):
    pjrt = child_lines[("pjrt", kind, where, "True", "grad")]
    assert pjrt.startswith("RuntimeError: hook 'hook raised "), pjrt
    assert f"raised {kind}: " in pjrt


def test_the_process_goes_on_computing_gradients(child_lines):
    assert ("after", "[2.0,", "2.0,", "2.0]") in child_lines

"""An error raised by a hook during a pjrt backward is a Python exception, never a process death.

torch throws a hook's error into autograd's C++ with the Python error still set, and the engine unwinds
through the ``pjrt`` device's Python stream guard, which cannot run then: before the fix any error in a
tensor hook, a module's full backward hook or pre-hook, or a ``grad_fn`` hook or pre-hook
(``KeyboardInterrupt`` included) aborted the process (``terminate called without an active exception``). ``loss.backward()`` raises the hook's own exception, as on the CPU; ``torch.autograd.grad``
raises torch's RuntimeError naming it. Each case runs in a child process, since the failure mode is a crash.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: What both child scripts start with: the errors a hook raises, and how one backward's outcome is printed.
PROLOGUE = textwrap.dedent('''
    import torch
    import pjrt_plugins.spmd as xs

    class Stop(BaseException):
        pass

    ERRORS = {"KeyboardInterrupt": KeyboardInterrupt("stop"), "ValueError": ValueError("bad"),
              "SystemExit": SystemExit(3), "Stop": Stop("mine")}

    def outcome(loss, x, call):
        try:
            if call == "backward":
                loss.backward()
            else:
                torch.autograd.grad(loss, [x])
            return "no error"
        except BaseException as exc:
            return f"{type(exc).__name__}: {exc}"
''')

CHILD = PROLOGUE + textwrap.dedent('''
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
            return outcome(y.sum(), x, call)

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


def _run_child(script: str) -> dict[tuple[str, ...], str]:
    """Each printed ``case words -> outcome`` line of ``script`` run in a child, which must not die."""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the process died ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    lines = {}
    for line in proc.stdout.splitlines():
        head, _, result = line.partition(" -> ")
        lines[tuple(head.split())] = result
    return lines


@pytest.fixture(scope="module")
def child_lines() -> dict[tuple[str, ...], str]:
    return _run_child(CHILD)


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


# Hooks on autograd's nodes: a module's full backward hook and pre-hook (torch registers them on the node
# of the module's input and output), and grad_fn.register_hook / register_prehook.
NODE_CHILD = PROLOGUE + textwrap.dedent('''
    def run(device, kind, where, threads, call):
        error = ERRORS[kind]

        def hook(*args):
            raise error

        m = torch.nn.Linear(3, 2).to(device)
        x = torch.ones(2, 3).to(device).requires_grad_()
        with torch.autograd.set_multithreading_enabled(threads):
            if where == "module":
                m.register_full_backward_hook(hook)
            elif where == "module_pre":
                m.register_full_backward_pre_hook(hook)
            y = m(x) * 2
            if where == "node":
                y.grad_fn.register_hook(hook)
            elif where == "node_pre":
                y.grad_fn.register_prehook(hook)
            return outcome(y.sum(), x, call)

    for device in ("cpu", "pjrt"):
        for kind in ERRORS:
            for where in ("module", "module_pre", "node", "node_pre"):
                for threads in (True, False):
                    for call in ("backward", "grad"):
                        print(device, kind, where, threads, call, "->", run(device, kind, where, threads, call))

    # Hooks that change the gradients, and a backward after all the errors above.
    def doubled(module, grad_input, grad_output):
        return tuple(None if g is None else g * 2 for g in grad_input)

    def tripled(module, grad_output):
        return tuple(g * 3 for g in grad_output)

    def plus_one(grad_inputs, grad_outputs):
        return tuple(None if g is None else g + 1 for g in grad_inputs)

    for device in ("cpu", "pjrt"):
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2).to(device)
        m.register_full_backward_hook(doubled)
        m.register_full_backward_pre_hook(tripled)
        x = torch.arange(6.).reshape(2, 3).to(device).requires_grad_()
        y = m(x).tanh()
        y.grad_fn.register_hook(plus_one)
        y.sum().backward()
        print(device, "changed", "->", x.grad.cpu().flatten().tolist(), m.weight.grad.cpu().flatten().tolist())

    # The same gradients by hand, without hooks: tanh's gradient + 1, times 3 into the module, input doubled.
    with torch.no_grad():
        m, x = m.cpu(), torch.arange(6.).reshape(2, 3)
        g = (1 - m(x).tanh() ** 2 + 1) * 3
        print("by-hand", "changed", "->", (2 * g @ m.weight).flatten().tolist(), (g.T @ x).flatten().tolist())
''')


@pytest.fixture(scope="module")
def node_child_lines() -> dict[tuple[str, ...], str]:
    return _run_child(NODE_CHILD)


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "ValueError", "SystemExit", "Stop"])
@pytest.mark.parametrize("where", ["module", "module_pre", "node", "node_pre"])
@pytest.mark.parametrize("threads", ["True", "False"])
def test_backward_raises_a_node_hooks_exception_as_on_the_cpu(node_child_lines, kind, where, threads):
    cpu = node_child_lines[("cpu", kind, where, threads, "backward")]
    pjrt = node_child_lines[("pjrt", kind, where, threads, "backward")]
    assert cpu.split(":")[0] == kind, cpu
    assert pjrt == cpu


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "ValueError"])
@pytest.mark.parametrize("where", ["module", "module_pre", "node", "node_pre"])
def test_autograd_grad_names_a_node_hooks_exception(node_child_lines, kind, where):
    pjrt = node_child_lines[("pjrt", kind, where, "True", "grad")]
    assert pjrt.startswith("RuntimeError: hook 'hook raised "), pjrt
    assert f"raised {kind}: " in pjrt
    cpu = node_child_lines[("cpu", kind, where, "True", "grad")]
    assert cpu.split(":")[0] == kind, cpu  # on the CPU, torch's own behaviour is untouched


def test_node_hooks_that_change_gradients_give_the_cpu_result(node_child_lines):
    def values(device: str) -> list[list[float]]:
        line = node_child_lines[(device, "changed")]
        return [[float(v) for v in part.strip(" []").split(",")] for part in line.split("] [")]

    cpu, pjrt, by_hand = values("cpu"), values("pjrt"), values("by-hand")
    assert len(cpu[0]) == 6 and len(cpu[1]) == 6
    for want, got, computed in zip(cpu, pjrt, by_hand):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert want == pytest.approx(computed, rel=1e-5, abs=1e-6)  # the hooks changed the gradients as asked

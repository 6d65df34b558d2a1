#!/usr/bin/env python
"""Run torch's OpInfo database on the pjrt device and compare every result with the CPU.

For each OpInfo that supports float32 (``torch.testing._internal.common_methods_invocations.op_db``),
the first 3 float32 samples run on the CPU and on ``pjrt:0`` (the CPU plugin with 8 devices, or
another plugin with ``--plugin``);
outputs (forward) and input gradients (backward, for ops that support autograd) must agree at
rtol = atol = 1e-4. A pass that needed the CPU fallback (``xs.metrics().fallbacks``) is counted
apart from a native one. Ops run in worker processes, many ops per process; a worker that dies
(abort, segfault) or hangs is replaced and the op it was running is recorded as a death, so one
crash costs one op, not the sweep. Ten deaths in a row with no op finishing in between stop the sweep
(exit status 2): then something every op needs is broken.

    .venv/bin/python scripts/opinfo_sweep.py                      # the whole sweep, prints the table
    .venv/bin/python scripts/opinfo_sweep.py --ops 'norm.*,roll' --verbose
    PJRT_ALLOCATOR_PREALLOCATE=0 .venv/bin/python scripts/opinfo_sweep.py --plugin gpu --jobs 8
    .venv/bin/python scripts/opinfo_sweep.py --shard 1/4 --json out-1.json
    .venv/bin/python scripts/opinfo_sweep.py --table out-*.json   # merge shard results into one table
    .venv/bin/python scripts/opinfo_sweep.py --table all.json rerun.json  # rerun.json's ops replace all.json's

``tests/spmd/test_opinfo.py`` runs a representative subset through the same functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

#: Samples per op, dtype and tolerances of the comparison (the issue's method).
SAMPLES = 3
RTOL = ATOL = 1e-4
#: Seconds one op (all its samples, forward and backward) may take before its worker is killed.
OP_TIMEOUT = 300.0
#: Worker deaths in a row, with no op finishing in between, after which the sweep stops: something every op
#: needs is broken (seen with a torch whose OpInfo database the sweep does not know), and replacing workers
#: one op at a time would only mark every op dead.
DEATHS_IN_A_ROW = 10

#: Ops whose values come from a random number generator (or are uninitialized memory): only the
#: shape, dtype and device of their results are compared, and their gradients' shapes.
RANDOM_OPS = frozenset({
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
    "normal.in_place", "normal.number_mean", "uniform", "rand_like", "randint", "randint_like", "randn",
    "randn_like", "nn.functional.alpha_dropout", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.feature_alpha_dropout.with_train", "nn.functional.rrelu",
})

#: Cases the OpInfo samples miss, run like OpInfo ops: name -> (OpInfo name, sample builder).
#: Each builder returns (input, args, kwargs) on the CPU.
EXTRA_CASES: dict[str, tuple[str, Any]] = {
    # PyTorch/XLA 2.9 dies (SIGFPE) on this one.
    "roll.empty": ("roll", lambda torch: (torch.empty(0), (1,), {})),
    "roll.empty_2d": ("roll", lambda torch: (torch.empty(0, 3), (2, 1), {})),
}

#: Cases that check the sweep itself (never in the default selection): a worker that dies, one that hangs.
HARNESS_CASES: dict[str, Any] = {
    "harness.abort": lambda: os.abort(),
    "harness.hang": lambda: time.sleep(3600),
}

STATUSES = ("pass", "fallback", "wrong", "error", "death", "timeout", "skip", "n/a")


@dataclasses.dataclass
class OpResult:
    """What one op did: ``forward`` / ``backward`` are one of :data:`STATUSES`.

    pass: every sample matched the CPU, natively; fallback: matched, but some op ran through the
    CPU fallback; wrong: ran and gave other values (or shapes, dtypes, devices); error: raised;
    death: the process died; timeout: ran past the time limit; skip: no sample the CPU could run;
    n/a: no backward to check (the op does not support autograd or has no float output).
    """

    op: str
    forward: str = "skip"
    backward: str = "n/a"
    forward_detail: str = ""
    backward_detail: str = ""
    fallback_ops: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def died(self) -> bool:
        return "death" in (self.forward, self.backward)


# =====================================================================================
# selecting ops
# =====================================================================================


def op_key(op: Any) -> str:
    """``name`` or ``name.variant`` (the names torch's test ids and the issue use, e.g. ``norm.inf``)."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def float32_ops() -> dict[str, Any]:
    """Every OpInfo whose CPU dtypes include float32, by :func:`op_key`."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    return {op_key(op): op for op in op_db if torch.float32 in op.supported_dtypes("cpu")}


def all_cases() -> list[str]:
    """The keys of every float32 OpInfo, then the extra cases."""
    return list(float32_ops()) + list(EXTRA_CASES)


def select_cases(cases: Sequence[str], patterns: str | None = None, shard: str | None = None) -> list[str]:
    """``cases`` that fully match one of the comma-separated regexes ``patterns``, then shard ``K/N`` of them."""
    chosen = list(cases)
    if patterns:
        regexes = [re.compile(p.strip()) for p in patterns.split(",") if p.strip()]
        chosen = [c for c in chosen if any(r.fullmatch(c) for r in regexes)]
    if shard:
        k, n = (int(v) for v in shard.split("/"))
        if not 1 <= k <= n:
            raise ValueError(f"--shard {shard}: K must be between 1 and N")
        chosen = chosen[k - 1 :: n]
    return chosen


# =====================================================================================
# checking one op (runs inside a worker process)
# =====================================================================================


class Mismatch(AssertionError):
    """The device's result differs from the CPU's."""


def _tree_map(fn: Any, value: Any) -> Any:
    """``fn`` applied to every leaf of nested lists, tuples (also torch's named return tuples) and dicts."""
    if isinstance(value, list):
        return [_tree_map(fn, v) for v in value]
    if isinstance(value, tuple):
        return tuple(_tree_map(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: _tree_map(fn, v) for k, v in value.items()}
    return fn(value)


def _leaves(value: Any) -> list[Any]:
    out: list[Any] = []
    _tree_map(out.append, value)
    return out


class Device:
    """The device under test: how to move a sample there, bring results back and count fallbacks."""

    def __init__(self, plugin: str = "cpu") -> None:
        import torch

        import pjrt_plugins.spmd as xs

        self.torch = torch
        self.xs = xs
        xs.set_plugin(plugin, options={"cpu_device_count": 8} if plugin == "cpu" else None)
        xs.set_cpu_fallback(True)  # counted per op: a pass through it is not a native pass
        self.device = xs.device()

    def move(self, value: Any) -> Any:
        """A CPU sample value on the device: tensors copied (leaves keep requires_grad), ``cpu`` devices renamed."""
        torch = self.torch

        def move_one(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                moved = v.detach().to(self.device)
                return moved.requires_grad_(v.requires_grad) if v.requires_grad else moved
            if isinstance(v, torch.device) and v.type == "cpu":
                return self.device
            if isinstance(v, str) and v == "cpu":
                return str(self.device)
            return v

        return _tree_map(move_one, value)

    def move_sample(self, sample: Any) -> Any:
        """An OpInfo ``SampleInput`` with its values on the device."""
        from torch.testing._internal.opinfo.core import SampleInput

        return SampleInput(self.move(sample.input), args=self.move(sample.args), kwargs=self.move(sample.kwargs),
                           output_process_fn_grad=sample.output_process_fn_grad,
                           broadcasts_input=sample.broadcasts_input)

    def fallbacks(self) -> tuple[int, dict[str, int]]:
        m = self.xs.metrics()
        return m.fallbacks, dict(m.fallback_ops)

    def reset(self) -> None:
        """Drop whatever the last op left pending (a failed op must not poison the next one)."""
        try:
            self.xs.sync()
        except Exception:  # noqa: BLE001 - the failure belonged to the previous op
            pass


def _compare(actual: Any, expected: Any, values: bool, what: str) -> None:
    """Raise :class:`Mismatch` unless ``actual`` (device results) equals ``expected`` (CPU results)."""
    import torch

    a_leaves, e_leaves = _leaves(actual), _leaves(expected)
    if len(a_leaves) != len(e_leaves):
        raise Mismatch(f"{what}: {len(a_leaves)} results, the CPU gives {len(e_leaves)}")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        where = f"{what}[{i}]" if len(e_leaves) > 1 else what
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{where}: got a {type(a).__name__}, the CPU gives a tensor")
            if a.device.type != "pjrt" and e.device.type == "cpu":
                raise Mismatch(f"{where}: the result is on {a.device}, not on the pjrt device")
            a_host = a.detach().cpu()
            if tuple(a_host.shape) != tuple(e.shape) or a_host.dtype != e.dtype:
                raise Mismatch(f"{where}: {a_host.dtype}{list(a_host.shape)}, the CPU gives {e.dtype}{list(e.shape)}")
            if not values:
                continue
            try:
                torch.testing.assert_close(a_host, e.detach(), rtol=RTOL, atol=ATOL, equal_nan=True)
            except AssertionError as exc:
                raise Mismatch(f"{where}: {_first_line(exc)}") from None
        elif values or not isinstance(e, (int, float)):
            try:
                torch.testing.assert_close(a, e, rtol=RTOL, atol=ATOL, equal_nan=True)
            except (AssertionError, TypeError) as exc:
                raise Mismatch(f"{where}: {a!r}, the CPU gives {e!r} ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[:3])[:400] if lines else type(exc).__name__


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _differentiable(torch: Any, t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()


def _samples(op: Any, key: str, torch: Any) -> list[Any]:
    from torch.testing._internal.opinfo.core import SampleInput

    torch.manual_seed(0)
    if key in EXTRA_CASES:
        inp, args, kwargs = EXTRA_CASES[key][1](torch)
        return [SampleInput(inp, args=args, kwargs=kwargs)]
    grad = bool(op.supports_autograd)
    out = []
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=grad):
        out.append(sample)
        if len(out) == SAMPLES:
            break
    return out


def check_op(key: str, device: Device, ops: dict[str, Any], report: Any = None) -> OpResult:
    """Run ``key``'s samples on the CPU and on ``device``; ``report(phase, result)`` is told before each phase."""
    torch = device.torch
    if key in HARNESS_CASES:
        if report:
            report("forward", OpResult(key))
        HARNESS_CASES[key]()
    op = ops[EXTRA_CASES[key][0]] if key in EXTRA_CASES else ops[key]
    result = OpResult(key)
    started = time.perf_counter()
    values = key not in RANDOM_OPS and not op.has_nondeterministic_output
    wants_backward = bool(op.supports_autograd)
    device.reset()
    fallbacks0, fallback_ops0 = device.fallbacks()

    if report:
        report("forward", result)
    forward_ok, runs = _forward(op, key, device, values, result)
    fallbacks1, fallback_ops1 = device.fallbacks()
    if forward_ok and fallbacks1 > fallbacks0:
        result.forward = "fallback"

    if wants_backward and result.forward in ("pass", "fallback"):
        if report:
            report("backward", result)
        _backward(runs, device, result)
        fallbacks2, fallback_ops2 = device.fallbacks()
        if result.backward == "pass" and fallbacks2 > fallbacks1:
            result.backward = "fallback"
        fallback_ops1 = fallback_ops2
    elif wants_backward and result.forward != "skip":
        result.backward, result.backward_detail = "error", "forward failed"
    result.fallback_ops = sorted(k for k, v in fallback_ops1.items() if v > fallback_ops0.get(k, 0))
    result.seconds = round(time.perf_counter() - started, 3)
    device.reset()
    return result


def _forward(op: Any, key: str, device: Device, values: bool, result: OpResult) -> tuple[bool, list[tuple]]:
    """Compare the forward results of each sample; returns (all matched, [(sample, moved, cpu out, device out)])."""
    torch = device.torch
    runs = []
    for i, sample in enumerate(_samples(op, key, torch)):
        try:
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001 - a sample the CPU cannot run tells nothing about the device
            continue
        sample_values = values and not _draws_random_numbers(op, sample, expected)
        moved = device.move_sample(sample)
        try:
            actual = op(moved.input, *moved.args, **moved.kwargs)
            # As torch's own cross-device test (test_compare_cpu): both sides through the sample's
            # output_process_fn_grad, which makes sign-ambiguous results (eigh, svd, qr) comparable.
            _compare(moved.output_process_fn_grad(actual), sample.output_process_fn_grad(expected), sample_values,
                     f"sample {i} output")
        except Mismatch as exc:
            result.forward, result.forward_detail = "wrong", str(exc)
            return False, runs
        except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
            result.forward, result.forward_detail = "error", f"sample {i}: {_describe(exc)}"
            return False, runs
        runs.append((sample, moved, expected, actual, sample_values))
    if runs:
        result.forward = "pass"
    return bool(runs), runs


def _draws_random_numbers(op: Any, sample: Any, expected: Any) -> bool:
    """Whether the sample's CPU results change with the seed (dropout_p > 0 in attention, a training-mode
    dropout argument): such a sample is compared by shape and dtype only, as the random ops are."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(2**31 - 1)
        try:
            again = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001 - it ran a moment ago: treat a failure as "not random"
            return False
    try:
        _compare(again, expected, True, "")
    except Mismatch:
        return True
    return False


def _backward(runs: list[tuple], device: Device, result: OpResult) -> None:
    """Compare the input gradients of each forward run (random output gradients, the same on both sides)."""
    torch = device.torch
    checked = 0
    for i, (sample, moved, expected, actual, values) in enumerate(runs):
        cpu_outs = _leaves(sample.output_process_fn_grad(expected))
        dev_outs = _leaves(moved.output_process_fn_grad(actual))
        pairs = [(c, d) for c, d in zip(cpu_outs, dev_outs) if _differentiable(torch, c)]
        cpu_ins = [t for t in _leaves((sample.input, sample.args, sample.kwargs)) if _differentiable(torch, t)]
        dev_ins = [t for t in _leaves((moved.input, moved.args, moved.kwargs)) if _differentiable(torch, t)]
        if not pairs or not cpu_ins:
            continue
        try:
            if any(not _differentiable(torch, d) for _, d in pairs) or len(dev_ins) != len(cpu_ins):
                raise Mismatch(f"sample {i}: the device's outputs or inputs do not require grad as the CPU's do")
            torch.manual_seed(1000 + i)
            grads = [torch.randn_like(c) for c, _ in pairs]
            expected_grads = torch.autograd.grad([c for c, _ in pairs], cpu_ins, grads, allow_unused=True)
            actual_grads = torch.autograd.grad([d for _, d in pairs], dev_ins, [device.move(g) for g in grads],
                                               allow_unused=True)
            expected_grads = [torch.zeros_like(x) if g is None else g for g, x in zip(expected_grads, cpu_ins)]
            actual_grads = [torch.zeros_like(x) if g is None else g for g, x in zip(actual_grads, dev_ins)]
            _compare(actual_grads, expected_grads, values, f"sample {i} gradient")
        except Mismatch as exc:
            result.backward, result.backward_detail = "wrong", str(exc)
            return
        except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
            result.backward, result.backward_detail = "error", f"sample {i}: {_describe(exc)}"
            return
        checked += 1
    result.backward = "pass" if checked else "n/a"


# =====================================================================================
# worker processes and their supervisor
# =====================================================================================


def worker_main(result_fd: int, plugin: str = "cpu") -> int:
    """Read case keys (a JSON list) from stdin; write one JSON event per line to ``result_fd``."""
    import warnings

    warnings.simplefilter("ignore")
    keys = json.loads(sys.stdin.read())
    out = os.fdopen(result_fd, "w", buffering=1)

    def emit(**event: Any) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    ops = float32_ops()
    device = Device(plugin)
    emit(event="ready")
    for key in keys:
        result = check_op(key, device, ops, report=lambda phase, res: emit(event="start", op=res.op, phase=phase,
                                                                            forward=res.forward))
        emit(event="result", result=dataclasses.asdict(result))
    return 0


def _describe_exit(returncode: int | None) -> str:
    from pjrt_plugins._child_process import describe_exit

    return "was still running" if returncode is None else describe_exit(returncode)


def _stderr_tail(path: str, count: int = 4) -> str:
    """The last ``count`` lines a worker wrote to stderr, without XLA's routine log lines."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(0, f.tell() - 8192)
            f.seek(start)
            lines = f.read().decode("utf-8", "replace").splitlines()[1 if start else 0 :]  # the first may be cut
    except OSError:
        return ""
    kept = [ln.strip() for ln in lines if ln.strip() and not ln.startswith(("W0000", "I0000", "WARNING: All"))]
    return " | ".join(kept[-count:])


class _Worker:
    """One worker process running ``keys`` in order, and where it is."""

    def __init__(self, keys: list[str], plugin: str) -> None:
        self.keys = keys
        self.plugin = plugin
        self.read_fd, write_fd = os.pipe()
        self.stderr = tempfile.NamedTemporaryFile(prefix="opinfo-worker-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", str(write_fd), "--plugin", plugin],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.stderr, pass_fds=(write_fd,), env=env,
        )
        os.close(write_fd)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(keys).encode())
        self.proc.stdin.close()
        self.buffer = b""
        self.current: tuple[str, str, str] | None = None  # (key, phase, forward status) being run
        self.since = time.monotonic()
        self.done: set[str] = set()

    def events(self, timeout: float) -> Iterator[dict]:
        """Events read within ``timeout`` seconds; stops at end of output."""
        ready, _, _ = select.select([self.read_fd], [], [], timeout)
        if not ready:
            return
        chunk = os.read(self.read_fd, 1 << 16)
        if not chunk:
            self.buffer += b"\n"
            raise EOFError
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)

    def remaining(self) -> list[str]:
        return [k for k in self.keys if k not in self.done]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        os.close(self.read_fd)
        self.stderr.close()
        os.unlink(self.stderr.name)


class SweepStopped(RuntimeError):
    """Workers kept dying with no op finishing in between (:data:`DEATHS_IN_A_ROW`)."""


def run_cases(keys: Sequence[str], *, jobs: int = 1, timeout: float = OP_TIMEOUT, startup_timeout: float = 300.0,
              on_result: Any = None, plugin: str = "cpu", deaths_in_a_row: int = DEATHS_IN_A_ROW) -> list[OpResult]:
    """Run ``keys`` in ``jobs`` worker processes on ``plugin``; a dead or hung worker is replaced, its op
    recorded as such. Raises :class:`SweepStopped` after ``deaths_in_a_row`` deaths with no op finishing."""
    queues = [list(keys[i::jobs]) for i in range(max(1, jobs))]
    results: dict[str, OpResult] = {}
    workers = [_Worker(q, plugin) for q in queues if q]
    deaths = 0
    while workers:
        for worker in list(workers):
            limit = timeout if worker.current else startup_timeout
            try:
                for event in worker.events(0.2):
                    worker.since = time.monotonic()
                    if event["event"] == "start":
                        worker.current = (event["op"], event["phase"], event["forward"])
                    elif event["event"] == "result":
                        res = OpResult(**event["result"])
                        deaths = 0
                        results[res.op] = res
                        worker.done.add(res.op)
                        worker.current = None
                        if on_result:
                            on_result(res)
                if time.monotonic() - worker.since <= limit:
                    continue
                worker.kill()
                status = "timeout"
            except EOFError:
                worker.proc.wait()
                status = "death"
            detail = f"the worker {_describe_exit(worker.proc.returncode)}"
            if status == "timeout":
                detail = f"ran past {limit:.0f} s; the worker was killed"
            tail = _stderr_tail(worker.stderr.name)
            if tail:
                detail += f"; last output: {tail}"
            rest = worker.remaining()
            if worker.current is None and rest and status == "death":
                worker.current = (rest[0], "forward", "")  # died before reporting (startup or between events)
            if worker.current is not None:
                key, phase, forward = worker.current
                res = OpResult(key)
                if phase == "forward":
                    res.forward, res.forward_detail = status, detail
                else:
                    res.forward, res.backward, res.backward_detail = forward, status, detail
                results[key] = res
                worker.done.add(key)
                if on_result:
                    on_result(res)
            worker.close()
            workers.remove(worker)
            deaths = deaths + 1 if status == "death" else 0
            if deaths >= deaths_in_a_row:
                for other in workers:
                    other.kill()
                    other.close()
                raise SweepStopped(
                    f"{deaths} workers in a row died with no op finishing in between; the last {detail}. Something "
                    "every op needs is broken (the environment, the plugin, a torch version the sweep does not "
                    "know): fix it and run the sweep again")
            rest = worker.remaining()
            if rest:
                workers.append(_Worker(rest, plugin))
    return [results[k] for k in keys if k in results]


# =====================================================================================
# the table
# =====================================================================================


@dataclasses.dataclass
class Summary:
    forward_total: int
    forward_pass: int
    forward_fallback: int
    backward_total: int
    backward_pass: int
    backward_fallback: int
    deaths: int

    @property
    def native_share(self) -> float:
        passes = self.forward_pass + self.backward_pass
        return (passes - self.forward_fallback - self.backward_fallback) / passes if passes else 0.0


def summarize(results: Iterable[OpResult]) -> Summary:
    """Totals over OpInfo ops (the extra cases are not counted: they are not OpInfos)."""
    rs = [r for r in results if r.op not in EXTRA_CASES and r.op not in HARNESS_CASES]
    fwd = [r for r in rs if r.forward != "skip"]
    bwd = [r for r in fwd if r.backward != "n/a"]
    return Summary(
        forward_total=len(fwd),
        forward_pass=sum(r.forward in ("pass", "fallback") for r in fwd),
        forward_fallback=sum(r.forward == "fallback" for r in fwd),
        backward_total=len(bwd),
        backward_pass=sum(r.backward in ("pass", "fallback") for r in bwd),
        backward_fallback=sum(r.backward == "fallback" for r in bwd),
        deaths=sum(r.died for r in rs),
    )


def table(results: Sequence[OpResult], label: str = "pjrt") -> str:
    """The issue's table: forward pass / backward pass / process deaths / native share."""
    s = summarize(results)

    def cell(passed: int, total: int, fallback: int) -> str:
        pct = f" ({100 * passed / total:.1f}%)" if total else ""
        return f"{passed} of {total}{pct}, {fallback} through the CPU fallback"

    return "\n".join([
        "| | forward pass | backward pass | process deaths | native share of passes |",
        "|---|---|---|---|---|",
        f"| {label} | {cell(s.forward_pass, s.forward_total, s.forward_fallback)} "
        f"| {cell(s.backward_pass, s.backward_total, s.backward_fallback)} | {s.deaths} "
        f"| {100 * s.native_share:.1f}% |",
    ])


def failures(results: Sequence[OpResult]) -> str:
    """One line per op that did not pass (forward or backward), grouped by status."""
    lines = []
    for r in results:
        for phase in ("forward", "backward"):
            status = getattr(r, phase)
            if status not in ("pass", "fallback", "skip", "n/a") and not (phase == "backward" and
                                                                       getattr(r, "forward_detail") and
                                                                       r.backward_detail == "forward failed"):
                lines.append(f"{status:8} {phase:8} {r.op}: {getattr(r, phase + '_detail')}")
    return "\n".join(sorted(lines))


def _load(paths: Sequence[str]) -> list[OpResult]:
    """The results in ``paths``; an op in a later file replaces the same op of an earlier one (a re-run)."""
    results: dict[str, OpResult] = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["results"]:
                results[r["op"]] = OpResult(**r)
    return list(results.values())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated regexes; run the cases whose key fully matches one")
    parser.add_argument("--shard", help="K/N: run every N-th case starting at the K-th (1-based)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes at once (default 1)")
    parser.add_argument("--timeout", type=float, default=OP_TIMEOUT, help="seconds per op before its worker is killed")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--table", nargs="+", metavar="JSON",
                        help="print the table of earlier --json results and exit (a later file's op replaces an earlier one's)")
    parser.add_argument("--list", action="store_true", help="print the selected case keys and exit")
    parser.add_argument("--verbose", "-v", action="store_true", help="print each op's result as it comes")
    parser.add_argument("--plugin", default="cpu",
                        help="the plugin under test (default: cpu, with 8 devices; any other with its own defaults)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker, args.plugin)
    if args.table:
        results = _load(args.table)
        print(table(results))
        return 0
    keys = select_cases(all_cases(), args.ops, args.shard)
    if args.list:
        print("\n".join(keys))
        return 0
    started = time.time()

    def progress(res: OpResult) -> None:
        if args.verbose:
            print(f"{res.op:50} forward {res.forward:8} backward {res.backward:8} {res.seconds:7.1f}s "
                  f"{res.forward_detail or res.backward_detail}"[:300], flush=True)

    try:
        results = run_cases(keys, jobs=args.jobs, timeout=args.timeout, on_result=progress, plugin=args.plugin)
    except SweepStopped as exc:
        print(f"the sweep stopped: {exc}", file=sys.stderr)
        return 2
    elapsed = time.time() - started
    if args.json:
        import torch

        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "cases": len(keys), "seconds": round(elapsed),
                       "load": os.getloadavg(), "results": [dataclasses.asdict(r) for r in results]}, f, indent=1)
    print(failures(results))
    print()
    print(table(results))
    print(f"\n{len(results)} cases in {elapsed:.0f} s (load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())

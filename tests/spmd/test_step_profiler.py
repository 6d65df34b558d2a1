"""``pjrt_plugins.spmd.profiler`` (PyTorch/XLA's ``torch_xla.debug.profiler`` names): host spans of ``Trace`` /
``StepTrace`` / ``trace_me`` written as a Chrome trace, and the plugin's device profile beside them when the
plugin has the PJRT profiler extension (the test shim's profiler stands for such a plugin; the real CPU
plugin has none, and the trace then says so).
"""

from __future__ import annotations

import json
import threading

import pytest
import torch

from pjrt_plugins.spmd import profiler as xp
from pjrt_plugins.spmd.frontend import engine as spmd_engine

from _exec_support import engine  # noqa: F401


@pytest.fixture(autouse=True)
def no_trace_left():
    yield
    try:
        xp.stop_trace()
    except RuntimeError:
        pass


def _spans(path) -> list[dict]:
    trace = json.loads(path.read_text())  # valid JSON, the Chrome trace event format
    assert set(trace) == {"traceEvents", "displayTimeUnit"}
    return trace["traceEvents"]


def test_step_spans_on_a_plugin_without_a_profiler(engine, tmp_path):
    w = torch.randn(8, 8).to("pjrt")

    @xp.trace_me("loss")
    def loss_of(x):
        return (x @ w).pow(2).mean()

    with pytest.warns(UserWarning, match="does not provide device traces"):
        xp.start_trace(tmp_path / "logs")
    losses = []
    for step in range(3):
        with xp.StepTrace("train_step", step_num=step):
            with xp.Trace("forward", layer=0):
                loss = loss_of(torch.randn(4, 8).to("pjrt"))
            losses.append(loss)
        assert spmd_engine().pending_ops() == 0  # the step ended with a sync
    result = xp.stop_trace()
    assert result.device_trace is None and result.spans == 9
    assert result.host_trace_path.parent == tmp_path / "logs"
    events = _spans(result.host_trace_path)
    steps = [e for e in events if e["name"] == "train_step"]
    assert [s["args"]["step_num"] for s in steps] == [0, 1, 2]
    assert steps[0]["args"]["compiles"] == 1 and steps[2]["args"]["compiles"] == 0  # the cache serves step 3
    assert all(s["args"]["executions"] == 1 for s in steps)
    for step in steps:  # each forward and loss span lies inside its step's span
        inner = [e for e in events if e["name"] in ("forward", "loss") and step["ts"] <= e["ts"]
                 and e["ts"] + e["dur"] <= step["ts"] + step["dur"]]
        assert len(inner) == 2
    forward = next(e for e in events if e["name"] == "forward")
    assert forward["args"] == {"layer": 0} and forward["ph"] == "X" and forward["dur"] > 0
    names = [e for e in events if e["ph"] == "M"]
    assert names == [{"name": "thread_name", "ph": "M", "pid": forward["pid"], "tid": threading.get_ident(),
                      "args": {"name": threading.current_thread().name}}]
    assert all(torch.isfinite(loss.cpu()) for loss in losses)


def test_one_trace_at_a_time_and_spans_outside_a_trace_are_dropped(engine, tmp_path):
    with xp.Trace("before"):
        pass
    with pytest.raises(RuntimeError, match="No profile started"):
        xp.stop_trace()
    with pytest.warns(UserWarning):
        xp.start_trace(tmp_path)
    with pytest.raises(RuntimeError, match="already been started"):
        xp.start_trace(tmp_path)
    with xp.Trace("inside"):
        pass
    result = xp.stop_trace()
    assert [e["name"] for e in _spans(result.host_trace_path) if e["ph"] == "X"] == ["inside"]
    with pytest.raises(ValueError, match="name"):
        xp.Trace("")


def test_a_failing_step_is_recorded_without_running_it(engine, tmp_path):
    with pytest.warns(UserWarning):
        xp.start_trace(tmp_path)
    x = torch.randn(4).to("pjrt")
    with pytest.raises(ZeroDivisionError):
        with xp.StepTrace("bad_step"):
            y = x * 2
            1 / 0
    assert spmd_engine().pending_ops() > 0  # no sync after an exception
    result = xp.stop_trace()
    assert [e["name"] for e in _spans(result.host_trace_path) if e["ph"] == "X"] == ["bad_step"]
    del y


def test_a_plugin_with_a_profiler_adds_its_device_profile(engine, tmp_path, build_shim):
    library = build_shim(SHIM_PROFILER=True)  # the test shim's profiler extension (a mock of a vendor's)
    xp.start_trace(tmp_path, plugin=str(library))
    with xp.StepTrace("train_step", step_num=0):
        (torch.randn(4, 4).to("pjrt") + 1).sum()
    result = xp.stop_trace()
    device = result.device_trace
    assert device is not None and device.xplane_path.is_file() and device.perfetto_path.is_file()
    assert device.run_dir.parent == tmp_path / "plugins" / "profile"
    assert [e["name"] for e in _spans(result.host_trace_path) if e["ph"] == "X"] == ["train_step"]

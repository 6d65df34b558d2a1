"""pjrt_plugins.profiler: a plugin's own profiler (its Profiler extension), written for TensorBoard and Perfetto.

Which plugins have a profiler here: the CUDA plugin (it runs without a GPU, and then records
nothing) and libtpu (its start fails without a TPU). The XLA CPU builds and the stub have none.
A trace with events comes from the test shim's profiler, a mock that records the CPU plugin's
executions (SHIM_PROFILER in shim_plugin.c); jaxlib's own XSpace parser reads what is written.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _support import clean_environment, package_file
from runtime_support import ADD_F32_4

from pjrt_plugins import PjrtError, UnsupportedExtensionError, profiler
from pjrt_plugins.runtime import Client, load_library
from pjrt_plugins.runtime._profiler import _without_terminator
from pjrt_plugins.runtime._xspace import chrome_trace, hostnames, trace_events

ProfileData = pytest.importorskip("jax.profiler").ProfileData

#: An XSpace in protobuf text format: a timed event (with a display name) and an aggregate one.
XSPACE_TEXT = """
planes {
  id: 1 name: "/device:X:0"
  lines { id: 1 name: "Stream" display_name: "Stream #1" timestamp_ns: 1000
          events { metadata_id: 1 offset_ps: 2000 duration_ps: 3000 }
          events { metadata_id: 2 num_occurrences: 4 duration_ps: 9 } }
  lines { id: 2 name: "Host" timestamp_ns: 5000 events { metadata_id: 3 offset_ps: 0 duration_ps: 1000000 } }
  event_metadata { key: 1 value { id: 1 name: "fusion.1" display_name: "fusion" } }
  event_metadata { key: 2 value { id: 2 name: "aggregate" } }
  event_metadata { key: 3 value { id: 3 name: "launch" } }
}
planes { id: 2 name: "/host:CPU" lines { id: 1 name: "main" timestamp_ns: 7 events { metadata_id: 1 offset_ps: 1000 } }
         event_metadata { key: 1 value { id: 1 name: "step" } } }
hostnames: "h1"
"""


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    """Vendor libraries (CUDA, libtpu) are profiled in a child: loading one is never undone in this process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180,
                          env=clean_environment())


# -- the XSpace reader ------------------------------------------------------------------------------


def test_an_xspace_becomes_chrome_trace_events_per_plane_and_line():
    xspace = ProfileData.text_proto_to_serialized_xspace(XSPACE_TEXT)
    assert hostnames(xspace) == ["h1"]
    assert [tuple(e) for e in trace_events(xspace)] == [
        ("/device:X:0", "Stream #1", "fusion", 1002.0, 3.0),  # display names win; the aggregate is left out
        ("/device:X:0", "Host", "launch", 5000.0, 1000.0),
        ("/host:CPU", "main", "step", 8.0, 0.0),
    ]
    events = chrome_trace(xspace)["traceEvents"]
    names = {(e["name"], e.get("pid"), e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {("process_name", 1, None): "/device:X:0", ("thread_name", 1, 1): "Stream #1",
                     ("thread_name", 1, 2): "Host", ("process_name", 2, None): "/host:CPU",
                     ("thread_name", 2, 3): "main"}
    spans = [e for e in events if e["ph"] == "X"]
    assert spans[0] == {"ph": "X", "name": "fusion", "pid": 1, "tid": 1, "ts": 1.002, "dur": 0.003}


def test_an_empty_xspace_and_a_counted_terminator():
    assert chrome_trace(b"")["traceEvents"] == []
    xspace = ProfileData.text_proto_to_serialized_xspace(XSPACE_TEXT)
    # Some plugins count a trailing NUL in the size; it is dropped only when it breaks the message.
    assert _without_terminator(xspace + b"\0") == xspace and _without_terminator(b"\0") == b""
    ends_in_zero = ProfileData.text_proto_to_serialized_xspace('hostnames: "a\\000"')
    assert ends_in_zero.endswith(b"\0") and _without_terminator(ends_in_zero) == ends_in_zero


# -- plugins with a profiler ------------------------------------------------------------------------


def test_a_step_traced_by_a_plugins_profiler_opens_in_xla_and_perfetto_readers(build_shim, tmp_path):
    library = load_library(build_shim(SHIM_PROFILER=True))
    assert profiler.has_profiler(library)
    with Client(library, {"cpu_device_count": 1}) as client:
        add = client.compile(ADD_F32_4)
        x = client.buffer_from_host(np.arange(4, dtype=np.float32))
        add.execute([[x, x]])  # before the trace: not in it
        with profiler.trace(tmp_path / "logs", client) as result:
            for _ in range(3):
                (out,) = add.execute([[x, x]])[0]
                np.testing.assert_array_equal(out.to_numpy(), [0, 2, 4, 6])
    assert result.events == 3
    assert result.run_dir.parent == tmp_path / "logs" / "plugins" / "profile"
    assert result.xplane_path == result.run_dir / "shim-host.xplane.pb"
    planes = {plane.name: plane for plane in ProfileData.from_file(str(result.xplane_path)).planes}
    (line,) = planes["/device:SHIM:0"].lines
    assert line.name == "Execute" and [event.name for event in line.events] == ["shim_execute"] * 3
    with gzip.open(result.perfetto_path, "rt") as trace_file:
        trace = json.load(trace_file)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["shim_execute"] * 3
    assert all(e["dur"] >= 0 for e in spans) and spans == sorted(spans, key=lambda e: e["ts"])


def test_the_profile_is_written_even_when_the_block_raises(build_shim, tmp_path):
    with pytest.raises(ZeroDivisionError):
        with profiler.trace(tmp_path, build_shim(SHIM_PROFILER=True), create_perfetto_trace=False) as result:
            1 / 0  # noqa: B018
    assert result.xplane_path.is_file() and result.perfetto_path is None


def test_a_failing_profiler_start_is_the_plugins_error(build_shim, tmp_path):
    library = build_shim(SHIM_PROFILER=True, SHIM_PROFILER_FAIL_START=True)
    with pytest.raises(PjrtError, match="PLUGIN_Profiler_Start failed with UNAVAILABLE: shim profiler: no tracer here") as caught:
        with profiler.trace(tmp_path, library):
            pytest.fail("the block must not run when the profiler cannot start")
    assert caught.value.code == 14
    assert not (tmp_path / "plugins").exists()


def test_the_cuda_plugins_profiler_runs_without_a_gpu_and_records_nothing():
    library = package_file("jax_plugins.xla_cuda13", "xla_cuda_plugin.so")
    assert library is not None, "the CUDA PJRT plugin is not installed: run scripts/setup"
    result = run_child(
        f"""
        import tempfile
        from pjrt_plugins import profiler
        with tempfile.TemporaryDirectory() as logs:
            with profiler.trace(logs, {str(library)!r}) as result:
                pass
            print(result.events, result.xplane_path.stat().st_size, result.perfetto_path.is_file())
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["0", "0", "True"]


def test_libtpu_without_a_tpu_refuses_to_start_with_its_reason():
    library = package_file("libtpu", "libtpu.so")
    assert library is not None, "libtpu is not installed: run scripts/setup"
    result = run_child(
        f"""
        import tempfile
        from pjrt_plugins import PjrtError, profiler
        with tempfile.TemporaryDirectory() as logs:
            try:
                with profiler.trace(logs, {str(library)!r}):
                    pass
            except PjrtError as exc:
                print(exc.function, exc.code_name)
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["PLUGIN_Profiler_Start", "UNIMPLEMENTED"]


# -- plugins without one ----------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["cpu", "stub"])
def test_a_plugin_without_a_profiler_says_so_before_the_block_runs(which, cpu_library_path, stub_library, tmp_path):
    library = cpu_library_path if which == "cpu" else stub_library
    assert not profiler.has_profiler(load_library(library))
    with pytest.raises(UnsupportedExtensionError, match=r"\.so does not provide a profiler: it has no Profiler extension") as caught:
        with profiler.trace(tmp_path, library):
            pytest.fail("the block must not run without a profiler")
    assert caught.value.extension == "Profiler" and isinstance(caught.value, NotImplementedError)


def test_plugins_are_named_by_name_plugin_client_or_path(cpu_library_path, client8):
    import pjrt_plugins

    cpu = load_library(cpu_library_path)
    assert profiler.plugin_library("cpu") is cpu
    assert profiler.plugin_library(pjrt_plugins.get_plugin("cpu")) is cpu
    assert profiler.plugin_library(client8) is cpu and profiler.plugin_library(cpu_library_path) is cpu
    with pytest.raises(TypeError, match="cannot profile int: pass a plugin name"):
        profiler.plugin_library(3)

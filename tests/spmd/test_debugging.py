"""``pjrt_plugins.spmd.debugging``: the sharding tables of ``visualize_sharding`` / ``visualize_tensor_sharding``
for tensors on a 2-D and a 1-D mesh of the real 8-device CPU plugin: plain text, HTML and rich.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest
import torch
from rich.console import Console

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import VirtualDeviceError
from pjrt_plugins.spmd import debugging

from _exec_support import engine  # noqa: F401

MESH_2D = xs.Mesh(range(8), (2, 4), ("data", "model"))
MESH_1D = xs.Mesh(range(8), (8,), ("x",))


def _rows(text: str) -> list[list[str]]:
    """The labels of a plain-text table, row by row."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("|") else []
        if any(cells):
            rows.append(cells)
    return rows


def test_a_2d_mesh_tiled_both_ways_draws_a_2_by_4_grid(engine, capsys):
    t = xs.mark_sharding(torch.randn(8, 8).to("pjrt"), MESH_2D, ("data", "model"))
    table = debugging.visualize_tensor_sharding(t)
    assert table.cells == (((0,), (1,), (2,), (3,)), ((4,), (5,), (6,), (7,)))
    assert _rows(str(table)) == [["CPU 0", "CPU 1", "CPU 2", "CPU 3"], ["CPU 4", "CPU 5", "CPU 6", "CPU 7"]]
    printed = capsys.readouterr().out
    assert "Visualizing {devices=[2,4]0,1,2,3,4,5,6,7}" in printed
    assert all(f"CPU {d}" in printed for d in range(8))


def test_replicated_groups_share_a_cell_and_the_transposed_mesh_order_shows(engine):
    t = xs.mark_sharding(torch.randn(8, 8).to("pjrt"), MESH_2D, (None, "data"))
    table = debugging.visualize_tensor_sharding(t)
    # Columns split over "data" (2 tiles), each tile held by the 4 devices of a "model" row.
    assert _rows(str(table)) == [["CPU 0,1,2,3", "CPU 4,5,6,7"]]
    t = xs.mark_sharding(torch.randn(8, 8).to("pjrt"), MESH_2D, ("model", None))
    assert _rows(str(debugging.visualize_tensor_sharding(t))) == [["CPU 0,4"], ["CPU 1,5"], ["CPU 2,6"], ["CPU 3,7"]]


def test_a_1d_mesh_draws_one_row(engine):
    t = xs.mark_sharding(torch.randn(16).to("pjrt"), MESH_1D, ("x",))
    table = debugging.visualize_tensor_sharding(t, scale=0.5)
    assert _rows(str(table)) == [[f"CPU {d}" for d in range(8)]]
    assert len(str(table).splitlines()) == 3  # scale 0.5: one line per row between the rules
    t = xs.mark_sharding(torch.randn(4, 16).to("pjrt"), MESH_1D, (None, "x"))
    assert _rows(str(debugging.visualize_tensor_sharding(t))) == [[f"CPU {d}" for d in range(8)]]


def test_replicated_unmarked_and_pending_tensors(engine):
    assert _rows(str(debugging.visualize_sharding(""))) == [["CPU 0,1,2,3,4,5,6,7"]]
    assert debugging.visualize_sharding("{replicated}").cells == ((tuple(range(8)),),)
    assert debugging.visualize_sharding("{maximal device=3}").cells == (((3,),),)
    x = xs.mark_sharding(torch.randn(8, 4).to("pjrt"), MESH_2D, ("data", None))
    pending = x * 2  # computed first: the layout the partitioner chose
    table = debugging.visualize_tensor_sharding(pending)
    assert table.sharding == pending.sharding_spec != ""


def test_html_and_rich_renderings(engine):
    table = debugging.visualize_sharding("{devices=[2,4]0,1,2,3,4,5,6,7}")
    page = table._repr_html_()
    assert page.startswith("<table") and page.count("<tr>") == 2 and page.count("<td") == 8
    assert "CPU 5" in page and "background:" in page
    assert "background:" not in debugging.visualize_sharding("{devices=[2,4]0,1,2,3,4,5,6,7}", use_color=False)._repr_html_()
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(table)
    drawn = out.getvalue()
    assert all(f"CPU {d}" in drawn for d in range(8))
    assert drawn.index("CPU 3") < drawn.index("CPU 4")  # row by row


_WITHOUT_RICH = """
import importlib.abc, sys
class WithoutRich(importlib.abc.MetaPathFinder):  # rich cannot be imported, as when it is not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "rich":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, WithoutRich())
import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import debugging
xs.set_plugin("cpu", options={"cpu_device_count": 8})
assert not debugging.rich_available()
table = debugging.visualize_sharding("{devices=[1,8]0,1,2,3,4,5,6,7}")
print("STR-FOLLOWS")
print(table)
try:
    table.__rich__()
except ImportError as exc:
    print("IMPORT-ERROR", exc)
"""


def test_without_rich_the_plain_table_prints(engine):
    result = subprocess.run([sys.executable, "-c", _WITHOUT_RICH], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    printed, _, plain = result.stdout.partition("STR-FOLLOWS\n")
    plain, _, error = plain.partition("IMPORT-ERROR")
    assert plain.strip() in printed and "+---" in printed  # the plain table is what printed
    assert _rows(plain) == [[f"CPU {d}" for d in range(8)]]
    assert "pip install rich" in error


def test_bad_input_says_what_is_wrong(engine):
    with pytest.raises(ValueError):
        debugging.visualize_sharding("{devices=[2,4]0,1,2}")
    with pytest.raises(ValueError, match="manual"):
        debugging.visualize_sharding("{manual}")
    with pytest.raises(TypeError):
        debugging.visualize_sharding(42)
    with pytest.raises(ValueError, match="max_width"):
        debugging.visualize_sharding("", max_width=1)
    with pytest.raises(VirtualDeviceError):
        debugging.visualize_tensor_sharding(torch.ones(2))
    narrow = debugging.visualize_sharding("{replicated}", max_width=12)
    assert max(len(line) for line in str(narrow).splitlines()) <= 12
    assert re.search(r"\| CPU 0,1~ \|", str(narrow))  # cut to fit, marked with ~

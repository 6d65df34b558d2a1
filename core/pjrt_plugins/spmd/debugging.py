"""Drawing shardings: which device holds which tile of a tensor (``torch_xla.distributed.spmd.debugging``).

Why: a sharding string such as ``{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}`` is hard to
read; a grid of the tensor's first two dimensions with the devices of each tile is not. The table
renders three ways, so it works everywhere: plain text (any terminal, no extra package), ``rich``
when it is installed (colours in a terminal, and in notebooks), and HTML (``_repr_html_``, which
notebooks show). JAX's ``jax.debug.visualize_array_sharding`` is the model.
"""

from __future__ import annotations

import html
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .devices import virtual_device
from .frontend.tensor import XLAShardedTensor, materialize, unwrap
from .sharding import OpSharding, ShardingType, parse_sharding

try:  # optional: the coloured table; without it the plain-text one prints
    from rich import align as _align
    from rich import box as _box
    from rich import padding as _padding
    from rich import style as _style
    from rich import table as _table
    from rich.console import Console as _RichConsole

    _Console: Any = _RichConsole
except ImportError:
    _Console = None

logger = logging.getLogger(__name__)

__all__ = ["ShardingTable", "visualize_sharding", "visualize_tensor_sharding"]

#: Background colours of the tiles in colour output (repeated when there are more tiles).
_COLOURS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#31a354", "#756bb1",
            "#e6550d", "#636363", "#9c9ede", "#cedb9c", "#e7ba52", "#e7969c", "#de9ed6", "#6baed6")


def rich_available() -> bool:
    """Whether the ``rich`` package is installed (it draws the coloured table)."""
    return _Console is not None


@dataclass(frozen=True)
class ShardingTable:
    """A drawn sharding: ``cells[i][j]`` are the devices holding tile ``(i, j)`` of the first two dimensions.

    ``str(table)`` is the plain-text table, ``table._repr_html_()`` an HTML one (notebooks show it), and
    ``rich`` renders ``table`` itself (``__rich__``) when it is installed.
    """

    sharding: str
    cells: tuple[tuple[tuple[int, ...], ...], ...]
    device_kind: str
    use_color: bool = True
    scale: float = 1.0
    min_width: int = 9
    max_width: int = 80

    def labels(self) -> list[list[str]]:
        """The text of each cell: the device kind and the devices, e.g. ``'CPU 0,1,2,3'``."""
        return [[f"{self.device_kind} {','.join(str(d) for d in cell)}" for cell in row] for row in self.cells]

    def _cell_width(self) -> int:
        columns = len(self.cells[0])
        longest = max(len(label) for row in self.labels() for label in row)
        width = max(self.min_width, int((longest + 2) * max(self.scale, 0.1)))
        return max(3, min(width, (self.max_width - 1) // columns - 1))

    def __str__(self) -> str:
        width = self._cell_width()
        height = max(1, int(3 * self.scale))
        rule = "+" + "+".join("-" * width for _ in self.cells[0]) + "+"
        lines = [rule]
        for row in self.labels():
            for k in range(height):
                texts = [(_fit(label, width - 2) if k == height // 2 else "").center(width) for label in row]
                lines.append("|" + "|".join(texts) + "|")
            lines.append(rule)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        height = max(1, int(3 * self.scale))
        width = self._cell_width()
        rows = []
        for i, row in enumerate(self.labels()):
            cells = []
            for j, label in enumerate(row):
                style = (f"border:1px solid #888;padding:{height * 4}px 4px;min-width:{width}ch;"
                         "text-align:center;font-family:monospace")
                if self.use_color:
                    style += f";background:{self._colour(i, j)};color:white"
                cells.append(f'<td style="{style}">{html.escape(label)}</td>')
            rows.append("<tr>" + "".join(cells) + "</tr>")
        caption = f"<caption>{html.escape(self.sharding)}</caption>"
        return f'<table style="border-collapse:collapse">{caption}{"".join(rows)}</table>'

    def _colour(self, i: int, j: int) -> str:
        return _COLOURS[(i * len(self.cells[0]) + j) % len(_COLOURS)]

    def __rich__(self) -> Any:
        """The table as a ``rich`` renderable (needs ``rich``)."""
        if not rich_available():
            raise ImportError("drawing the table with rich needs rich: pip install rich (str(table) needs nothing)")
        align, box, padding, style, table = _align, _box, _padding, _style, _table
        height = max(1, int(3 * self.scale))
        grid = table.Table(show_header=False, show_lines=not self.use_color, padding=0, pad_edge=False,
                           box=None if self.use_color else box.SQUARE)
        width = self._cell_width()
        for i, row in enumerate(self.labels()):
            cells = []
            for j, label in enumerate(row):
                look = style.Style(bgcolor=self._colour(i, j), color="white") if self.use_color else style.Style()
                pad = (height // 2, 1, height - 1 - height // 2, 1)
                cells.append(padding.Padding(align.Align(label, "center", vertical="middle", width=width - 2),
                                             pad, style=look))
            grid.add_row(*cells)
        return grid


def _fit(label: str, width: int) -> str:
    return label if len(label) <= width else label[: max(width - 1, 0)] + "~"


def _cells(spec: OpSharding, all_devices: Sequence[int]) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The devices of each tile of the first two dimensions (tiles of later dimensions are merged in)."""
    kind = spec.type
    if kind is ShardingType.REPLICATED:
        return ((tuple(all_devices),),)
    if kind is ShardingType.MAXIMAL:
        return (((spec.devices[0],),),)
    if spec.is_manual:
        raise ValueError(f"sharding {spec} is manual: each device holds its own value, there are no tiles to draw")
    tiles = spec.tiles
    if len(tiles) == 0:
        return ((tuple(sorted(spec.devices)),),)
    rows, cols = (1, tiles[0]) if len(tiles) == 1 else (tiles[0], tiles[1])
    grid: list[list[list[int]]] = [[[] for _ in range(cols)] for _ in range(rows)]
    for device in spec.devices:
        coords = spec.tile_coordinates(device)
        i, j = (0, coords[0]) if len(tiles) == 1 else (coords[0], coords[1])
        grid[i][j].append(int(device))
    return tuple(tuple(tuple(sorted(cell)) for cell in row) for row in grid)


def visualize_sharding(sharding: str | OpSharding, use_color: bool = True, scale: float = 1.0,
                       min_width: int = 9, max_width: int = 80) -> ShardingTable:
    """Print a table of which devices hold which tile of a tensor sharded as ``sharding``, and return it.

    ``sharding`` is an HLO sharding string (``t.sharding_spec``; ``''`` means replicated, as in
    PyTorch/XLA) or an :class:`OpSharding`. The table covers the first two dimensions (a 1-D
    tensor is one row; tiles of later dimensions are merged into their cell). It prints with
    ``rich`` when that is installed (colours unless ``use_color=False``), else as plain text;
    ``scale`` sizes the cells, ``min_width``/``max_width`` bound a cell's and the table's width
    in characters. Raises ``ValueError`` for a sharding that is not a valid HLO sharding or is
    manual (each device then holds its own value).

    Example (8 devices)::

        debugging.visualize_sharding("{devices=[2,4]0,1,2,3,4,5,6,7}")   # 2 rows x 4 columns, one device each
    """
    if isinstance(sharding, OpSharding):
        spec = sharding
    elif isinstance(sharding, str):
        spec = OpSharding.replicated() if sharding.strip() == "" else parse_sharding(sharding)
    else:
        raise TypeError(f"visualize_sharding takes an HLO sharding string or an OpSharding, "
                        f"got {type(sharding).__name__}")
    if max_width < 3 or min_width < 1 or scale <= 0:
        raise ValueError(f"visualize_sharding needs max_width >= 3, min_width >= 1 and scale > 0, got {max_width}, "
                         f"{min_width} and {scale}")
    vd = virtual_device()
    kind = str(vd.client.platform_name).upper()
    table = ShardingTable(spec.to_hlo(), _cells(spec, vd.device_ids), kind, use_color, scale, min_width, max_width)
    _print(table, max_width)
    return table


def visualize_tensor_sharding(t: torch.Tensor, **kwargs: Any) -> ShardingTable:
    """:func:`visualize_sharding` of the pjrt tensor ``t``'s sharding (keywords as there).

    A pending tensor is computed first (as printing it would), so the table shows the layout it
    has, the one it was marked with or the one the partitioner chose.

    Example (8 devices)::

        t = xs.mark_sharding(torch.randn(8, 4).to("pjrt"), mesh, ("data", None))
        debugging.visualize_tensor_sharding(t)
    """
    if not isinstance(t, XLAShardedTensor):
        unwrap(t)  # raises the error that says to move it to pjrt
    data = unwrap(t)
    materialize([data])
    spec = data.annotation if data.annotation is not None else data.sharding
    return visualize_sharding(spec if spec is not None else "", **kwargs)


def _print(table: ShardingTable, max_width: int) -> None:
    print(f"Visualizing {table.sharding} (showing up to the first two dimensions)")
    if _Console is not None:
        _Console(width=max_width, file=sys.stdout).print(table, end="\n\n")
    else:
        print(table, end="\n\n")

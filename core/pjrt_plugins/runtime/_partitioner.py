"""Does a plugin partition with Shardy? Found by compiling a tiny sharded ``sdy`` program, never guessed from names.

A plugin that cannot parse the ``sdy`` dialect refuses the program; one that ignores
``use_shardy_partitioner`` compiles it without splitting the argument (then GSPMD is what it runs).
Both answers come back as a reason, so callers fall back to GSPMD and say why.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from ._compile_options import CompileOptions

logger = logging.getLogger(__name__)

__all__ = ["SHARDY_PROBE_PROGRAM", "shardy_refusal"]

#: The probe: ``x`` (2 elements per device) split over every device, doubled. ``{n}``: the device count,
#: ``{length}``: 2 * n. A test may swap it for a program the plugin refuses, to exercise the fallback.
SHARDY_PROBE_PROGRAM = """
module @shardy_probe attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  sdy.mesh @mesh = <["x"={n}]>
  func.func public @main(%x: tensor<{length}xf32> {{sdy.sharding = #sdy.sharding<@mesh, [{{"x"}}]>}})
      -> (tensor<{length}xf32> {{sdy.sharding = #sdy.sharding<@mesh, [{{"x"}}]>}}) {{
    %y = stablehlo.add %x, %x : tensor<{length}xf32>
    return %y : tensor<{length}xf32>
  }}
}}
"""


def shardy_refusal(client: Any, device_ids: Sequence[int]) -> str | None:
    """None when ``client`` partitions an ``sdy`` program over ``device_ids`` with Shardy, else the reason not."""
    n = len(device_ids)
    program = SHARDY_PROBE_PROGRAM.format(n=n, length=2 * n)
    options = CompileOptions(num_partitions=n, use_spmd_partitioning=True, device_assignment=[list(device_ids)],
                             use_shardy_partitioner=True)
    try:
        executable = client.compile(program.encode(), options)
    except Exception as exc:  # noqa: BLE001 - any refusal is the answer
        return f"the plugin refused a Shardy program: {type(exc).__name__}: {str(exc).strip()[:300]}"
    try:
        text = executable.optimized_hlo_text()
    except Exception as exc:  # noqa: BLE001 - no optimized program to read: the compile is the answer
        logger.debug("the Shardy probe's optimized program is unreadable: %s", exc)
        return None
    finally:
        _release(executable)
    params = re.findall(r"=\s*f32\[(\d+)\][^\n]*parameter\(0\)", text)
    if params and all(int(p) == 2 * n for p in params) and n > 1:
        return "the plugin compiled the Shardy program without splitting its sharded argument (it ignores Shardy)"
    return None


def _release(executable: Any) -> None:
    close = getattr(executable, "delete", None)
    if close is not None:
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - best effort
            logger.debug("could not release the probe executable: %s", exc)

"""Input-output aliasing on the real CPU plugin: an argument marked ``tf.aliasing_output`` is donated.

The plugin writes the output into the argument's memory and marks the argument's buffer deleted; the
runtime's Buffer then refuses to be read with a clear error, and frees its handle once (no double free).
Run with the compiled fast path and without it (``PJRT_PLUGINS_FASTPATH=0``, in a subprocess).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pjrt_plugins.runtime import PjrtError

#: ``x + y``, with ``x`` donated to the result (what jax emits for ``donate_argnums=0``).
DONATING_ADD = """
module @donating_add {
  func.func public @main(%x: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %y: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %x, %y : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""


def _f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def test_a_donated_argument_is_deleted_and_its_output_is_right(client8):
    exe = client8.compile(DONATING_ADD)
    x = client8.buffer_from_host(_f32([1, 2, 3, 4]))
    y = client8.buffer_from_host(_f32([10, 20, 30, 40]))
    [[out]] = exe.execute([[x, y]])
    np.testing.assert_array_equal(out.to_numpy(), [11, 22, 33, 44])
    assert x.is_deleted  # donated: the plugin dropped it
    assert not y.is_deleted  # not marked: still there
    np.testing.assert_array_equal(y.to_numpy(), [10, 20, 30, 40])
    with pytest.raises(PjrtError):
        x.to_numpy()
    # A donated buffer cannot be an argument again: a clear error, nothing runs.
    with pytest.raises((PjrtError, ValueError)):
        exe.execute([[x, y]])
    x.delete()  # frees the handle once; a second delete is a no-op
    x.delete()
    # The output is a normal buffer: donating it again in a loop works step after step.
    for step in range(3):
        [[nxt]] = exe.execute([[out, y]])
        assert out.is_deleted
        out = nxt
    np.testing.assert_array_equal(out.to_numpy(), [41, 82, 123, 164])


def test_the_same_buffer_donated_and_read_in_one_call_is_refused(client8):
    exe = client8.compile(DONATING_ADD)
    x = client8.buffer_from_host(_f32([1, 2, 3, 4]))
    with pytest.raises(PjrtError):
        exe.execute([[x, x]])
    np.testing.assert_array_equal(x.to_numpy(), [1, 2, 3, 4])  # refused before anything ran


def test_donation_without_the_compiled_fast_path(cpu_library_path):
    code = textwrap.dedent(f"""
        import numpy as np
        from pjrt_plugins.runtime import Client, PjrtError, _fastpath
        assert _fastpath.library is None
        client = Client({str(cpu_library_path)!r}, {{"cpu_device_count": 1}}, schema={{"cpu_device_count": int}},
                        plugin_name="cpu")
        exe = client.compile({DONATING_ADD!r})
        x = client.buffer_from_host(np.arange(4, dtype=np.float32))
        y = client.buffer_from_host(np.ones(4, dtype=np.float32))
        [[out]] = exe.execute([[x, y]])
        assert x.is_deleted and not y.is_deleted
        assert out.to_numpy().tolist() == [1, 2, 3, 4]
        try:
            x.to_numpy()
        except PjrtError:
            pass
        else:
            raise AssertionError("a donated buffer was read")
        del x, out
        client.close()
        print("ok")
    """)
    env = dict(os.environ, PJRT_PLUGINS_FASTPATH="0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")

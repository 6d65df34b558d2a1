"""Every shell and Python block of the README and the docs runs as written, unless marked as unable to run here.

Each block runs alone, in a subprocess, from a scratch directory that shows the checkout's
top-level entries (so ``./scripts/...`` and ``examples/...`` resolve and files the block
writes stay out of the tree), with this environment's ``bin/`` first on ``PATH`` and ``.venv``
pointing at it. Console blocks run their ``$`` commands in order under ``bash -e``. A Python
block that imports neither torch nor ``pjrt_plugins.spmd`` runs as on an install without the
``[spmd]`` extra: torch, jax and jaxlib cannot be imported.
How to mark a block that cannot run here: docs/contributing.md.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _support import clean_environment
from doc_blocks import PYTHON, REPO, Block, MarkerError, all_blocks, blocks, documents

#: One block's limit: the slowest ones compile an SPMD program with torch and jaxlib.
BLOCK_TIMEOUT_S = 240
#: A Python block that mentions none of these must work with the core install alone.
_NEEDS_SPMD_EXTRA = re.compile(r"^\s*(import|from)\s+(torch|jax|jaxlib)\b|pjrt_plugins\.spmd", re.M)
#: Run before such a block: the [spmd] extra's packages are absent, as after `pip install pjrt-plugins`.
_WITHOUT_SPMD_EXTRA = """\
import importlib.abc, sys
class _WithoutSpmdExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "jax", "jaxlib"):
            raise ModuleNotFoundError(f"No module named {name!r} (the block runs as without pjrt-plugins[spmd])", name=name)
sys.meta_path.insert(0, _WithoutSpmdExtra())
del importlib, sys, _WithoutSpmdExtra
"""


#: A block that needs torch: Python importing it or the SPMD layer, or a console block starting torchrun.
_NEEDS_TORCH = re.compile(r"^\s*(import|from)\s+torch\b|pjrt_plugins\.spmd|\btorchrun\b", re.M)
_HAS_TORCH = importlib.util.find_spec("torch") is not None


def _params() -> list:
    params = []
    for block in all_blocks():
        if not block.runnable:
            continue
        marks = [pytest.mark.skip(reason=f"marked in the doc: {block.skip}")] if block.skip else []
        if not marks and not _HAS_TORCH and _NEEDS_TORCH.search(block.text):
            # scripts/test-matrix runs this suite without torch (on Python 3.12+ it is a multi-GB CUDA build)
            marks = [pytest.mark.skip(reason="needs torch (pjrt-plugins[spmd]), which this environment lacks")]
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


def _scratch_dir(tmp_path: Path) -> Path:
    """A directory whose entries link to the checkout's top level, with ``.venv`` -> this environment."""
    for entry in REPO.iterdir():
        if entry.name not in (".git", ".venv"):
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    return tmp_path


def block_command(block: Block) -> list[str]:
    """The command that runs ``block``: Python (core-only blocks behind the no-[spmd] prelude), or bash."""
    if block.language in PYTHON:
        prelude = "" if _NEEDS_SPMD_EXTRA.search(block.text) else _WITHOUT_SPMD_EXTRA
        return [sys.executable, "-c", prelude + block.script()]
    return ["bash", "-e", "-o", "pipefail", "-c", block.script()]


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    env = clean_environment({"PATH": f"{bin_dir}:{clean_environment().get('PATH', '')}", "VIRTUAL_ENV": sys.prefix})
    return subprocess.run(block_command(block), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("block", _params())
def test_block_runs_as_written(block: Block, tmp_path: Path):
    assert not block.installs_packages(), (
        f"{block.id} installs or removes packages, which would change the environment the tests run in; "
        "mark it '<!-- docs-test: skip REASON -->' (see docs/contributing.md)"
    )
    assert block.script().strip(), f"{block.id} has no command: prefix each command of a console block with '$ '"
    result = run_block(block, _scratch_dir(tmp_path))
    assert result.returncode == 0, (
        f"the {block.language} block at {block.id} failed (exit {result.returncode}):\n{block.text}\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    )
    assert "Traceback (most recent call last)" not in result.stderr, result.stderr[-3000:]


def test_every_marker_parses():
    for path in documents():
        blocks(path)  # raises MarkerError naming the line


def test_the_documents_have_runnable_blocks():
    """The scan finds what it should: the README's and the user guide's blocks are among them."""
    ids = {block.id.split(":")[0] for block in all_blocks() if block.runnable and not block.skip}
    assert {"README.md", "docs/user-guide.md", "docs/spmd.md"} <= ids, ids


def test_a_marker_needs_a_reason_and_a_block(tmp_path: Path):
    cases = {
        "<!-- docs-test: skip -->\n```python\npass\n```\n": "needs a reason",
        "<!-- docs-test: maybe later -->\n```python\npass\n```\n": "unknown docs-test directive",
        "<!-- docs-test: skip needs a GPU -->\n\nSome text.\n```python\npass\n```\n": "right before a code fence",
        "<!-- docs-test: skip needs a GPU -->\n```text\nnothing runs\n```\n": "never runs",
        "text\n<!-- docs-test: skip needs a GPU -->\n": "no code block after it",
    }
    for text, message in cases.items():
        (tmp_path / "page.md").write_text(text)
        with pytest.raises(MarkerError, match=message):
            blocks(Path("page.md"), tmp_path)


def test_console_blocks_run_their_commands_only(tmp_path: Path):
    (tmp_path / "page.md").write_text(
        "<!-- docs-test: skip needs a GPU -->\n"
        "```console\n$ echo one \\\n  two\noutput line\n$ pip install x\n```\n"
        "   ```python\n   print('indented')\n   ```\n"
    )
    console, python = blocks(Path("page.md"), tmp_path)
    assert console.skip == "needs a GPU" and console.line == 2
    assert console.script() == "echo one \\\n  two\npip install x\n"
    assert console.installs_packages()
    assert python.text == "print('indented')\n" and python.skip is None


def test_a_failing_block_fails(tmp_path: Path):
    """The runner reports a failing command (the whole test would be green otherwise)."""
    (tmp_path / "page.md").write_text("```console\n$ true\n$ false\n$ echo unreachable\n```\n")
    (block,) = blocks(Path("page.md"), tmp_path)
    result = run_block(block, tmp_path)
    assert result.returncode != 0 and "unreachable" not in result.stdout


def test_a_core_only_block_cannot_import_torch(tmp_path: Path):
    """Python blocks that do not ask for torch run as on an install without it, so they cannot lean on it."""
    (tmp_path / "page.md").write_text("```python\nimport numpy\n__import__('torch')\n```\n"
                                      "```python\nimport torch\n```\n")
    core_only, with_torch = blocks(Path("page.md"), tmp_path)
    failed = run_block(core_only, tmp_path)
    assert failed.returncode != 0 and "without pjrt-plugins[spmd]" in failed.stderr, failed.stderr
    assert block_command(with_torch)[-1] == "import torch\n"  # a block that asks for torch runs as written

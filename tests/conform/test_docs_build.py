"""The documentation site builds offline with `mkdocs build --strict` (any warning fails it),
and its generated pages cover every hook and every conformance check."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conform_support import REPO

DOCS_PACKAGES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [name for name in DOCS_PACKAGES if importlib.util.find_spec(name.split(".")[0]) is None]
    if missing:
        message = f"the docs toolchain is not installed ({', '.join(missing)}): pip install -r docs/requirements.txt"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must build the docs
        pytest.skip(message)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PJRT_PLUGINS_AUTOLOAD": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stderr, result.stderr
    return out


def test_every_page_of_the_nav_is_built(site):
    for page in ("user-guide", "vendor-guide", "hooks", "conformance", "architecture", "benchmarks", "missing",
                 "api/core", "api/runtime", "api/spmd", "api/distributed", "api/conform", "api/errors"):
        assert (site / page / "index.html").is_file(), page


def test_the_hooks_page_documents_every_hookspec(site):
    from pjrt_plugins import hookspecs

    specs = [name for name in dir(hookspecs) if name.startswith("pjrt_") and hasattr(getattr(hookspecs, name), "pjrt_plugins_spec")]
    html = (site / "hooks" / "index.html").read_text()
    assert len(specs) >= 16
    for name in specs:
        assert f'id="pjrt_plugins.hookspecs.{name}"' in html, f"{name} is missing from the hooks page"


def test_the_conformance_page_lists_every_check(site):
    from pjrt_plugins.conform import check_plan

    html = (site / "conformance" / "index.html").read_text()
    listed = set(re.findall(r"<code>([a-z_]+\.[a-z0-9_&;<>]+)</code>", html))
    for check_id, _ in check_plan():
        assert check_id in listed or (check_id.startswith("buffers.") and f"<code>{check_id.split('.', 1)[1]}</code>" in html), check_id


def test_the_api_reference_renders_docstrings(site):
    runtime = (site / "api" / "runtime" / "index.html").read_text()
    assert 'id="pjrt_plugins.runtime.Client"' in runtime and "struct_size" in runtime
    spmd = (site / "api" / "spmd" / "index.html").read_text()
    assert 'id="pjrt_plugins.spmd.mark_sharding"' in spmd
    # doctest blocks render as highlighted code, not as broken reference links
    shards = spmd[spmd.index('id="pjrt_plugins.spmd.ShardingSpec.shards"'):][:6000]
    assert '<span class="gp">&gt;&gt;&gt; </span>' in shards  # the pycon lexer's prompt token
    assert "[-2:]" in re.sub(r"<[^>]+>", "", shards)

"""The documentation site builds offline with `mkdocs build --strict` (any warning fails it) from
docs/requirements.txt alone, and its generated pages cover every hook and every conformance check."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from _support import clean_environment, link_installed_distributions
from conform_support import REPO

DOCS_REQUIREMENTS = REPO / "docs" / "requirements.txt"


def docs_requirements() -> list[Requirement]:
    lines = [line.split("#", 1)[0].strip() for line in DOCS_REQUIREMENTS.read_text().splitlines()]
    return [Requirement(line) for line in lines if line]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `pip install -r docs/requirements.txt` then `mkdocs build --strict` would build it.

    The build runs in a new environment that holds exactly docs/requirements.txt's distributions
    (and what they need), linked from this one: not pjrt-plugins itself.
    """
    work = tmp_path_factory.mktemp("docs")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True, timeout=120)
    python = work / "venv" / "bin" / "python"
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True).stdout.strip()
    link_installed_distributions([r.name for r in docs_requirements()], work / "linked", Path(site_packages))
    env = clean_environment({"NO_MKDOCS_2_WARNING": "1"})
    alone = subprocess.run([str(python), "-c", "import pjrt_plugins"], capture_output=True, text=True, env=env, cwd=work)
    assert alone.returncode != 0, "the docs environment must not have pjrt_plugins installed"
    out = work / "site"
    result = subprocess.run(
        [str(python), "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=work, capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stderr, result.stderr
    return out


def test_docs_requirements_pin_the_cores_dependencies():
    """The conform-checks hook imports the core from core/, so the docs environment needs its dependencies."""
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = {canonicalize_name(r.name): r for r in docs_requirements()}
    for text in core:
        wanted = Requirement(text)
        assert canonicalize_name(wanted.name) in pinned, f"docs/requirements.txt lacks {wanted.name}"
        (version,) = [s.version for s in pinned[canonicalize_name(wanted.name)].specifier]
        assert wanted.specifier.contains(version), f"docs/requirements.txt pins {wanted.name}=={version}, outside {wanted}"


def test_api_pages_render_sphinx_roles_as_code(site):
    html = "".join(page.read_text() for page in (site / "api").glob("*/index.html"))
    html += (site / "hooks" / "index.html").read_text()
    leftovers = re.findall(r":(?:func|class|meth|attr|mod|data|exc|obj):", re.sub(r"<[^>]+>", "", html))
    assert not leftovers, f"{len(leftovers)} Sphinx roles rendered as literal text"
    assert "<code>pjrt_unavailable_reason</code>" in html  # was :func:`pjrt_unavailable_reason`


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
    shards = spmd[spmd.index('id="pjrt_plugins.spmd.OpSharding.shards"'):][:6000]
    assert '<span class="gp">&gt;&gt;&gt; </span>' in shards  # the pycon lexer's prompt token
    assert "[-2:]" in re.sub(r"<[^>]+>", "", shards)

"""``pjrt-plugins new-plugin NAME``: write a new plugin package from the stub_neuron template.

The template is ``plugins/stub_neuron`` (its only copy in the repository): read from
the source tree next to an editable install, or from the copy a built wheel of
pjrt-plugins carries. Every name is rewritten (distribution, package, class, entry
point, library, environment variables, C identifiers); the result builds, installs
and passes ``pjrt-plugins conform NAME`` as it is.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from .._cli_common import EXIT_OK, UsageError, print_json
from . import _template_files

HELP = "write a new plugin package (C library + Python hooks) from the stub_neuron template"

#: Names a new plugin may not take (canonical spelling): the reference backends' and their aliases,
#: PyTorch/XLA's and JAX's own platforms, and prefixes of core names.
RESERVED_NAMES = frozenset(
    {"cpu", "gpu", "tpu", "stub-neuron", "cuda", "rocm", "neuron", "xpu", "library", "pjrt", "xla", "torch", "jax"}
)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_TEMPLATE_PACKAGE = "pjrt_plugin_stub_neuron"
#: The real Neuron library's path, an example in the template's messages; a new plugin gets its own.
_TEMPLATE_EXAMPLE_LIBRARY = "/opt/aws/neuron/lib/libneuronpjrt.so"
#: The template's device-count variable (its name for a new plugin comes from rewrite()).
_TEMPLATE_CHIP_COUNT_ENV = "NEURONCORE_NUM_DEVICES"


@dataclass(frozen=True)
class PluginNames:
    """Every spelling of a plugin's name the template needs."""

    entry_point: str  # acme-chip: the torch_xla.plugins entry point, PJRT_DEVICE=ACME-CHIP (PyTorch/XLA too)
    jax_platform: str  # acme_chip: the jax_plugins entry point, JAX_PLATFORMS=acme_chip
    package: str  # pjrt_plugin_acme_chip
    distribution: str  # pjrt-plugin-acme-chip
    class_name: str  # AcmeChipPlugin
    upper: str  # ACME_CHIP (environment variables, C macros)
    camel: str  # AcmeChip
    library: str  # libpjrt_acme_chip.so

    @classmethod
    def from_name(cls, name: str) -> PluginNames:
        """Validate ``name`` (``acme``, ``acme-chip``, ``Acme_Chip``) and derive every spelling."""
        entry = name.strip().lower().replace("-", "_")
        if not _NAME.match(entry) or entry.endswith("_") or "__" in entry:
            raise ValueError(
                f"plugin name {name!r} must start with a letter and contain only letters, digits and single "
                "'-' or '_' (at most 40 characters), e.g. 'acme' or 'acme-npu'"
            )
        # PyTorch/XLA cuts PJRT_DEVICE at the first '_', so its entry point is spelt with '-';
        # JAX's platform names and the Python/C identifiers keep '_'.
        hyphenated = entry.replace("_", "-")
        if hyphenated in RESERVED_NAMES:
            raise ValueError(
                f"plugin name {hyphenated!r} is taken (by a reference backend, PyTorch/XLA, JAX or the core); "
                "choose your device's own name"
            )
        camel = "".join(part.capitalize() for part in entry.split("_"))
        return cls(
            entry_point=hyphenated,
            jax_platform=entry,
            package=f"pjrt_plugin_{entry}",
            distribution=f"pjrt-plugin-{hyphenated}",
            class_name=f"{camel}Plugin",
            upper=entry.upper(),
            camel=camel,
            library=f"libpjrt_{entry}.so",
        )

    def replacements(self) -> list[tuple[str, str]]:
        """Template spelling -> new spelling, most specific first."""
        return [
            (_TEMPLATE_EXAMPLE_LIBRARY, f"/opt/{self.jax_platform}/lib/{self.library}"),
            (_TEMPLATE_PACKAGE, self.package),
            ("pjrt-plugin-stub-neuron", self.distribution),
            ("libpjrt_stub_neuron", self.library.removesuffix(".so")),
            ("StubNeuronPlugin", self.class_name),
            ("StubNeuron", self.camel),
            ("STUB-NEURON", self.entry_point.upper()),
            ("STUB_NEURON", self.upper),
            ("stub_neuron", self.jax_platform),
            ("stub-neuron", self.entry_point),
            ("NEURON", self.upper),
            ("Neuron", self.camel),
            ("neuron", self.jax_platform),
        ]

    def rewrite(self, text: str) -> str:
        for old, new in self.replacements():
            text = text.replace(old, new)
        return text


#: Largest template file read (the stub's largest is about 26 kB): a bigger one is refused, not loaded.
MAX_TEMPLATE_FILE_BYTES = 4 << 20


class TemplateNotFoundError(FileNotFoundError):
    """No plugin template could be found (neither given, packaged, nor in a source checkout)."""


class TemplateFileError(ValueError):
    """A template file new-plugin refuses to copy: a symbolic link, outside the template, not a regular
    file, too large, or not UTF-8 text. The message names the file."""


def _is_template(path: Path) -> bool:
    return all((path / marker).is_file() for marker in _template_files.TEMPLATE_MARKERS)


def find_template(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The template directory: ``explicit``, else the copy in this installed package, else the source tree.

    A built wheel of pjrt-plugins carries the template as package data
    (``pjrt_plugins/conform/_template``); an editable install reads
    ``plugins/stub_neuron`` of its checkout.
    """
    if explicit is not None:
        path = Path(explicit).expanduser().resolve()
        if not _is_template(path):
            raise TemplateNotFoundError(
                f"{path} is not a plugin template: it needs {' and '.join(_template_files.TEMPLATE_MARKERS)} "
                f"(point --template at a copy of {_template_files.TEMPLATE_SOURCE})"
            )
        return path
    here = Path(__file__).resolve().parent
    candidates = [here / _template_files.PACKAGED_TEMPLATE, here.parents[2] / _template_files.TEMPLATE_SOURCE]
    for candidate in candidates:
        if _is_template(candidate):
            return candidate
    raise TemplateNotFoundError(
        "this installation of pjrt-plugins carries no plugin template (looked in "
        + ", ".join(str(c) for c in candidates)
        + f"). Pass --template PATH to a checkout's {_template_files.TEMPLATE_SOURCE}"
    )


def _template_paths(template: Path) -> list[Path]:
    """The template's files, each checked to be a regular file reached without a symbolic link."""
    paths: list[Path] = []
    for pattern in _template_files.TEMPLATE_FILES:
        for path in sorted(template.glob(pattern)):
            if _checked_template_path(template, path):
                paths.append(path)
    return paths


def _checked_template_path(template: Path, path: Path) -> bool:
    """True for a regular file inside ``template``, False for a directory; raises TemplateFileError otherwise.

    Every component below the template is looked at without following links: a template
    whose ``csrc/x.h`` (or ``csrc`` itself) links to ``/etc/shadow`` would otherwise copy
    that file into a package its author then builds and publishes.
    """
    relative = path.relative_to(template)
    current = template
    for part in relative.parts:
        current = current / part
        try:
            st = os.lstat(current)
        except OSError as exc:
            raise TemplateFileError(f"template file {relative} in {template}: cannot read it: {exc}") from None
        if stat.S_ISLNK(st.st_mode):
            raise TemplateFileError(
                f"template file {relative} in {template}: {current.relative_to(template)} is a symbolic link "
                f"(to {os.readlink(current)}); a template holds only regular files, so copy the file itself there"
            )
    if stat.S_ISDIR(st.st_mode):
        return False
    if not stat.S_ISREG(st.st_mode):
        raise TemplateFileError(f"template file {relative} in {template} is not a regular file (a FIFO, socket or device)")
    if os.path.commonpath([os.path.realpath(path), str(template)]) != str(template):
        raise TemplateFileError(f"template file {relative} resolves outside the template {template}")
    return True


def _read_template_file(template: Path, path: Path) -> str:
    """The text of one checked template file, opened without following a link (it may have changed since)."""
    relative = path.relative_to(template)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise TemplateFileError(f"template file {relative} in {template}: cannot open it: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise TemplateFileError(f"template file {relative} in {template} is not a regular file")
        if st.st_size > MAX_TEMPLATE_FILE_BYTES:
            raise TemplateFileError(
                f"template file {relative} in {template} is {st.st_size} bytes, more than the "
                f"{MAX_TEMPLATE_FILE_BYTES >> 20} MiB a template file may have"
            )
        data = f.read(MAX_TEMPLATE_FILE_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TemplateFileError(
            f"template file {relative} in {template} is not UTF-8 text (byte {exc.start}: {exc.reason}); "
            "save it as UTF-8"
        ) from None


def _drop_template_comments(text: str) -> str:
    """Remove the pyproject comment paragraphs that explain the stub's own naming."""
    out, paragraph = [], []
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("#"):
            paragraph.append(line)
            continue
        if paragraph and not any("neuron" in p.lower() for p in paragraph):
            out.extend(paragraph)
        paragraph = []
        out.append(line)
    if paragraph and not any("neuron" in p.lower() for p in paragraph):
        out.extend(paragraph)
    return "".join(out)


def write_plugin(
    name: str,
    destination: str | os.PathLike[str] | None = None,
    *,
    template: str | os.PathLike[str] | None = None,
) -> tuple[Path, list[Path]]:
    """Write the package for plugin ``name`` into ``destination`` (default ``./pjrt-plugin-NAME``).

    Returns the package directory and the files written. Raises ``ValueError`` for a
    bad name, ``FileExistsError`` if ``destination`` exists and is not empty,
    :class:`TemplateNotFoundError` if no template can be found, and
    :class:`TemplateFileError` (before writing anything) for a template file that is a
    symbolic link, leaves the template, is not a regular file, or is not UTF-8 text.
    """
    names = PluginNames.from_name(name)
    source = find_template(template)
    texts = {
        path.relative_to(source): _read_template_file(source, path)
        for path in _template_paths(source)
        if path.relative_to(source).as_posix() != "README.md"  # the new package gets its own README below
    }
    root = Path(destination) if destination is not None else Path.cwd() / names.distribution
    root = root.expanduser().resolve()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root} already exists and is not empty; choose another --output")
    written = []
    for relative, text in texts.items():
        if relative.name == "pyproject.toml":
            text = re.sub(r"\n{3,}", "\n\n", _drop_template_comments(text))
        text = names.rewrite(text)
        if relative.name == "pyproject.toml":
            text = re.sub(
                r'^description = ".*"$',
                f'description = "The {names.entry_point} PJRT plugin for pjrt-plugins (from the stub_neuron template)."',
                text,
                count=1,
                flags=re.M,
            )
        target = root / names.rewrite(relative.as_posix())
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    readme = root / "README.md"
    readme.write_text(_readme(names), encoding="utf-8")
    written.append(readme)
    return root, written


def _readme(names: PluginNames) -> str:
    return f"""# {names.distribution}

The `{names.entry_point}` PJRT device plugin for [pjrt-plugins](https://pypi.org/project/pjrt-plugins/),
generated by `pjrt-plugins new-plugin {names.entry_point}` from the `stub_neuron` template.

It starts as a working stub: a small PJRT C API library in C (`csrc/`, built into
`{names.package}/{names.library}` by `setup.py`) that holds buffers on
`{names.rewrite(_TEMPLATE_CHIP_COUNT_ENV)}` devices (default 4) but cannot compile, and the Python hooks in
`{names.package}/_plugin.py` (class `{names.class_name}`, entry point `{names.entry_point}` in the
group `torch_xla.plugins`; entry point `{names.jax_platform}` in the group `jax_plugins`).

Its name is `{names.entry_point}`: `PJRT_DEVICE={names.entry_point.upper()}` selects it, in PyTorch/XLA too
(which cuts `PJRT_DEVICE` at the first `_`, so the entry point is spelt with `-`), and pjrt-plugins
also takes `{names.jax_platform}`. JAX calls it `{names.jax_platform}` (`JAX_PLATFORMS={names.jax_platform}`).

```console
$ pip install .                            # compiles the library with gcc
$ pjrt-plugins list                        # {names.entry_point} is listed
$ pjrt-plugins conform {names.entry_point}             # the conformance harness: no FAIL
```

## Make it yours

1. Replace `csrc/*.c` with your PJRT implementation. To ship a library built elsewhere inside
   the wheel, delete `csrc/` and keep `setup.py`: it packs `{names.package}/{names.library}`
   (or the file `{names.upper}_PREBUILT_LIBRARY` names) into a `py3-none-<platform>` wheel.
   If the library is not in your wheel at all, delete `csrc/` and `setup.py` and make
   `pjrt_library_path()` in `_plugin.py` return its path (honour `{names.upper}_LIBRARY_PATH`
   as `_library.py` does). Before publishing, `auditwheel repair` the wheel.
2. Declare every create option your `PJRT_Client_Create` reads in `OPTION_SCHEMA`
   (`_plugin.py`), with its type.
3. Make `pjrt_physical_chip_count()` count your devices cheaply (sysfs, PCI ids), and make
   `pjrt_unavailable_reason()` / `pjrt_preflight()` fail fast when they are absent.
4. Give each local rank its own device in `pjrt_configure_multiprocess()` (`_topology.py`).
5. Raise `pjrt_priority()` above 0 once the plugin should be chosen by default.
6. Run `pjrt-plugins conform {names.entry_point}` after every change; keep a report with
   `--report before.json` and compare releases with `--diff before.json after.json`.

Comments and docstrings were rewritten from the Neuron stub's; read them as a
starting point. The vendor guide of pjrt-plugins explains every hook and when it is called.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a new PJRT plugin package from the stub_neuron template: a C library with the PJRT C API "
        "(buffers, no compiler) and the Python DevicePlugin with its entry point. It builds, installs "
        "and passes `pjrt-plugins conform NAME` as generated."
    )
    parser.add_argument("name", metavar="NAME", help="the plugin's name, as users select it (PJRT_DEVICE=NAME), e.g. acme")
    parser.add_argument("-d", "--output", metavar="DIR", help="where to write the package (default: ./pjrt-plugin-NAME)")
    parser.add_argument("--template", metavar="DIR", help="template directory (default: the one pjrt-plugins carries)")


def run(args: argparse.Namespace) -> int:
    try:
        names = PluginNames.from_name(args.name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # FileExistsError and TemplateNotFoundError are OSErrors: the CLI reports them (exit 1, or JSON with --json).
    root, written = write_plugin(args.name, args.output, template=args.template)
    steps = [f"pip install {root}", "pjrt-plugins list", f"pjrt-plugins conform {names.entry_point}"]
    if args.json:
        print_json({"names": asdict(names), "path": str(root), "files": [str(p) for p in written], "next": steps})
        return EXIT_OK
    print(f"wrote {len(written)} files to {root}")
    print(f"  distribution {names.distribution}, package {names.package}, class {names.class_name}")
    print(f"  entry point  {names.entry_point} = \"{names.package}:{names.class_name}\" (group torch_xla.plugins)")
    print(f"  entry point  {names.jax_platform} = \"{names.package}.jax_plugin\" (group jax_plugins)")
    print("next:\n" + "\n".join(f"  {step}" for step in steps))
    return EXIT_OK

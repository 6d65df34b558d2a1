"""`pjrt-plugins CMD | head -1`: a reader that closes the pipe early ends every command quietly, with status 0."""

from __future__ import annotations

import subprocess
import sys

import pytest

from _support import clean_environment

COMMANDS = [
    ["list"],
    ["list", "--json"],
    ["--help"],
    ["devices", "stub_neuron"],
    ["doctor", "--help"],
    ["conform", "--help"],
    ["new-plugin", "--help"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_closed_pipe_ends_the_command_quietly(args):
    # The read end is closed before the command prints anything (its imports alone take longer),
    # so every write it makes meets a closed pipe, as with `| head -0`.
    process = subprocess.Popen(
        [sys.executable, "-m", "pjrt_plugins", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_environment(), text=True,
    )
    process.stdout.close()
    stderr = process.stderr.read()
    status = process.wait(timeout=120)
    assert status == 0, stderr
    assert "BrokenPipeError" not in stderr and "Exception ignored" not in stderr, stderr


def test_head_gets_the_first_line():
    result = subprocess.run(
        f"{sys.executable} -m pjrt_plugins list | head -1", shell=True, executable="/bin/bash",
        capture_output=True, text=True, env=clean_environment(), timeout=120,
    )
    assert result.stdout.split()[:2] == ["NAME", "DISTRIBUTION"], result.stdout
    assert result.stderr == "", result.stderr


# -- an output that cannot be written -------------------------------------------------------

FULL_COMMANDS = [
    ["list"],
    ["list", "--json"],
    ["--help"],
    ["--version"],
    ["doctor", "--help"],
    ["devices", "stub_neuron", "--json"],
    ["conform", "--help"],
]


@pytest.mark.parametrize("args", FULL_COMMANDS, ids=" ".join)
def test_a_full_disk_is_said_in_one_line_with_status_1(args):
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "pjrt_plugins", *args], stdout=full, stderr=subprocess.PIPE,
                                text=True, env=clean_environment(), timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "pjrt-plugins: cannot write the output: [Errno 28] No space left on device"
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr


@pytest.mark.parametrize("args", [["list"], ["list", "--json"], ["doctor", "stub_neuron"], ["--help"]], ids=" ".join)
def test_a_closed_stdout_is_said_in_one_line_with_status_1(args):
    command = " ".join([sys.executable, "-m", "pjrt_plugins", *args])
    result = subprocess.run(["bash", "-c", f"{command} >&-"], capture_output=True, text=True, env=clean_environment(),
                            timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("pjrt-plugins: standard output is closed"), result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_a_stderr_that_cannot_be_written_does_not_stop_doctor():
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "pjrt_plugins", "doctor", "stub_neuron"], stdout=subprocess.PIPE,
                                stderr=full, text=True, env=clean_environment(), timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("1 plugin checked: 1 ok"), result.stdout

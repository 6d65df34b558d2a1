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

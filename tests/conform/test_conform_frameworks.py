"""conform's frameworks.* checks: a plugin with a NULL slot that XLA's C++ client calls unchecked.

Our runtime gates every slot, so such a plugin passes every other check; JAX and
torch_xla crash on it. The checks must FAIL and name the slot, and survive the crash.
(The clean CPU plugin and stub are in test_conform_plugins.py.)
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def null_topology(fake_plugin) -> str:
    return str(fake_plugin("FAKE_NULL_SLOT=PJRT_Client_TopologyDescription"))


def test_a_null_slot_the_cpp_client_calls_is_a_fail_that_names_it(run_cli, null_topology):
    run = run_cli("conform", null_topology, "--json")
    assert run.returncode == 1, run
    report = run.report()
    # our own client does not need the slot: everything it checks still passes
    assert report["client.devices"][0] == "PASS" and report["buffers.float32"][0] == "PASS"
    status, reason = report["frameworks.slots"]
    assert status == "FAIL" and reason.startswith("NULL: PJRT_Client_TopologyDescription.") and "SIGSEGV" in reason
    status, reason = report["frameworks.xla_client"]
    assert status == "FAIL", reason
    assert "killed by SIGSEGV while creating the client" in reason, reason
    assert "it calls PJRT_Client_TopologyDescription there, which the plugin leaves NULL" in reason, reason
    assert report["frameworks.jax"] == ("SKIP", "needs frameworks.xla_client (FAIL)")
    assert report["process.exit"][0] == "PASS"  # the crash stayed in the probe's own process
    assert report["_raw"]["verdict"] == "defects"


def test_a_library_printing_forged_events_changes_no_result(run_cli, fake_plugin):
    # It prints the events of conform's check process and of the framework probe, and writes them
    # to every descriptor it can: each process reports on a private channel, signed.
    run = run_cli("conform", str(fake_plugin("FAKE_FORGE_EVENTS")), "--json")
    report = run.report()
    raw = report["_raw"]
    assert raw["target"]["api_version"] != "0.999" and raw["target"]["library_path"] != "/FORGED", raw["target"]
    assert report["buffers.float32"][0] == "PASS"
    status, reason = report["frameworks.xla_client"]
    assert status == "PASS" and "FORGED" not in reason and "'neuron'" in reason, reason
    assert all("FORGED" not in check["title"] + check["reason"] for check in raw["checks"]), raw["checks"]

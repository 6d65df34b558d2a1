"""Reports: --json and --report write the same JSON, --diff compares two, usage errors exit 2."""

from __future__ import annotations

import json

import pytest

from pjrt_plugins.conform import CheckResult, Report, Status, diff_reports, load_report


def _report(**statuses: str) -> Report:
    return Report(
        target={"plugin": "x", "api_version": "0.81"},
        checks=[CheckResult(k.replace("_", "."), k, Status(v), f"because {k}") for k, v in statuses.items()],
    )


def test_a_report_survives_a_json_round_trip(tmp_path):
    report = _report(abi_load="PASS", compile_program="UNSUPPORTED", execute_single="SKIP", buffers_f16="FAIL")
    path = tmp_path / "r.json"
    report.write(path)
    again = load_report(path)
    assert [(c.id, c.status, c.reason) for c in again.checks] == [(c.id, c.status, c.reason) for c in report.checks]
    assert again.ok is False and again.counts() == {"PASS": 1, "FAIL": 1, "UNSUPPORTED": 1, "SKIP": 1}


def test_a_file_that_is_not_a_report_is_refused_with_the_reason(tmp_path):
    (tmp_path / "a.json").write_text('{"checks": []}')
    with pytest.raises(ValueError, match="not a conformance report"):
        load_report(tmp_path / "a.json")
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        load_report(tmp_path / "b.json")


def test_diff_names_regressions_fixes_and_other_changes():
    before = _report(a="PASS", b="FAIL", c="SKIP", d="PASS", gone="PASS")
    after = _report(a="FAIL", b="PASS", c="UNSUPPORTED", d="PASS", new="PASS")
    diff = diff_reports(before, after)
    kinds = {c.id: c.kind for c in diff.changes}
    assert kinds == {"a": "regression", "b": "fixed", "c": "changed", "gone": "removed", "new": "added"}
    assert [c.id for c in diff.regressions] == ["a"]
    assert diff_reports(before, before).changes == []


def test_json_output_and_report_file_hold_the_same_report(run_cli, tmp_path):
    path = tmp_path / "stub.json"
    run = run_cli("conform", "stub_neuron", "--json", "--report", str(path))
    assert run.returncode == 0, run
    printed, written = run.json(), json.loads(path.read_text())
    assert printed["format"] == written["format"] == "pjrt-plugins-conform/1"
    assert [c["id"] for c in printed["checks"]] == [c["id"] for c in written["checks"]]
    assert printed["summary"] == written["summary"] and printed["summary"]["FAIL"] == 0
    assert printed["target"]["distribution"] == "pjrt-plugin-stub-neuron"
    assert all(c["status"] in ("PASS", "FAIL", "UNSUPPORTED", "SKIP") and c["title"] for c in printed["checks"])


def test_diff_of_a_healthy_and_a_broken_build_exits_1_and_lists_the_regressions(run_cli, fake_plugin, tmp_path):
    healthy, broken = tmp_path / "healthy.json", tmp_path / "broken.json"
    assert run_cli("conform", str(fake_plugin()), "--report", str(healthy)).returncode == 0
    assert run_cli("conform", str(fake_plugin("FAKE_CORRUPT_READS")), "--report", str(broken)).returncode == 1
    run = run_cli("conform", "--diff", str(healthy), str(broken))
    assert run.returncode == 1, run
    regressions = [line.split()[1] for line in run.stdout.splitlines() if line.strip().startswith("regression")]
    assert "buffers.float32" in regressions and "client.devices" not in regressions
    assert "PASS -> FAIL" in run.stdout
    same = run_cli("conform", "--diff", str(healthy), str(healthy), "--json")
    assert same.returncode == 0, same
    assert same.json()["changes"] == [] and same.json()["regressions"] == 0


@pytest.mark.parametrize(
    "args",
    [
        ["conform"],
        ["conform", "cpu", "--diff", "a.json", "b.json"],
        ["conform", "cpu", "--timeout", "0"],
        ["conform", "cpu", "-o", "no_such_option=1"],
        ["conform", "--bare", "cpu"],
    ],
)
def test_usage_errors_exit_2(run_cli, args):
    run = run_cli(*args)
    assert run.returncode == 2, run
    assert "error:" in run.stderr


def test_an_unknown_plugin_name_lists_the_installed_ones(run_cli):
    run = run_cli("conform", "no_such_device")
    assert run.returncode == 1, run
    assert "no_such_device" in run.stderr and "stub-neuron" in run.stderr


def test_a_run_mostly_skipped_here_is_inconclusive_with_its_first_cause_not_conforms():
    from pjrt_plugins.conform.cli import _describe

    checks = [
        CheckResult("abi.load", "", Status.PASS),
        CheckResult("client.create", "", Status.SKIP, "the plugin reports it cannot run here: no chips"),
        CheckResult("buffers.f32", "", Status.SKIP, "needs client.create (SKIP)"),
        CheckResult("execute.single", "", Status.SKIP, "needs client.create (SKIP)"),
    ]
    report = Report(target={"plugin": "x"}, checks=checks)
    assert report.ok and report.verdict == "inconclusive"
    assert report.inconclusive_reason() == (
        "3 of 4 checks could not run here: client.create: the plugin reports it cannot run here: no chips"
    )
    assert report.to_json()["verdict"] == "inconclusive"
    text = _describe(report)
    assert "=> inconclusive here" in text and "conforms" not in text and "no chips" in text
    # as many checks ran as were skipped: the run vouches for what it did
    ran = Report(target={"plugin": "x"}, checks=checks[:2] + [CheckResult("b", "", Status.UNSUPPORTED)])
    assert ran.verdict == "conforms" and "=> conforms" in _describe(ran)
    failed = Report(target={"plugin": "x"}, checks=checks + [CheckResult("c", "", Status.FAIL, "boom")])
    assert failed.verdict == "defects" and failed.inconclusive_reason() is None


def _report_file(tmp_path, name: str = "r.json") -> str:
    report = Report({"argument": "x", "plugin": "x"}, [CheckResult("a", "A", Status.PASS)])
    path = tmp_path / name
    report.write(path)
    return str(path)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[" * 200_000 + b"]" * 200_000, "is JSON nested too deeply to be a conformance report"),
        (b'{"format": "pjrt-plugins-conform/1", "checks": [' + b"[" * 50_000 + b"]" * 50_000 + b"]}",
         "is JSON nested too deeply"),
        (b"\xff\xfe not text", "is not UTF-8 text"),
        (b'{"format": "pjrt-plugins-conform/1", "checks": [1, "two"]}', None),
    ],
    ids=["a deep list", "deep inside a report", "not UTF-8", "checks that are not objects"],
)
def test_diff_refuses_a_file_that_is_not_a_report_with_its_name(run_cli, tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    run = run_cli("conform", "--diff", str(bad), _report_file(tmp_path))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run
    assert f"'{bad}'" in run.stderr and "ValueError" in run.stderr, run
    assert message is None or message in run.stderr, run


def test_diff_reads_at_most_a_report_sized_prefix_of_an_endless_file(run_cli, tmp_path):
    run = run_cli("conform", "--diff", "/dev/zero", "/dev/zero", timeout=60)
    assert run.returncode == 1 and "'/dev/zero' is larger than 16 MiB: not a conformance report" in run.stderr, run


def test_diff_reads_reports_from_pipes(tmp_path):
    import subprocess
    import sys

    report = _report_file(tmp_path)
    result = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m pjrt_plugins conform --diff <(cat "{report}") "{report}" --json'],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["changes"] == []

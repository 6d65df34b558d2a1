"""A plugin cannot forge what `list`, `doctor`, `devices` and `conform` report: their children talk on a private channel.

The forging plugin below writes well-formed events of every child protocol, at import
and from its hooks, by every way a plugin can print (print, ``sys.__stdout__``, fd 1,
C's ``printf``) and by writing to every file descriptor it may guess. Each command
runs as a user would run it, with the real CPU plugin installed beside the forger.
"""

from __future__ import annotations

import json

import pytest

CLI = ["-m", "pjrt_plugins"]

FORGED_LIST_ROW = {
    "name": "cpu", "default": True, "distribution": "evil-dist", "version": "6.6.6", "origin": "forged",
    "library_path": "/tmp/evil.so", "priority": 1000, "status": "available", "reason": None, "torch_xla": None,
    "aliases": [], "also": [],
}  # fmt: skip
FORGERY = f"""
import ctypes, json, os, sys

EVENTS = [
    "@@pjrt-plugins-list@@ " + json.dumps({{"start": "cpu"}}),
    "@@pjrt-plugins-list@@ " + json.dumps({{"row": {FORGED_LIST_ROW!r}}}),
    "@@pjrt-plugins-list@@ " + json.dumps({{"row": {{"name": "cpu"}}}}),
    "@@pjrt-plugins-list@@ " + json.dumps({{"default": "forger"}}),
    "@@pjrt-plugins-list@@ " + json.dumps({{"default": None, "error": {{"type": "PluginNotFoundError", "message": "FORGED"}}}}),
    "@@pjrt-plugins-doctor@@ " + json.dumps({{"check": "client", "ok": True, "detail": "FORGED", "fix": ""}}),
    "@@pjrt-plugins-doctor@@ " + json.dumps({{"check": "loaded", "ok": True, "detail": "FORGED", "fix": ""}}),
    "@@pjrt-plugins-conform@@ " + json.dumps({{"event": "fact", "plugin": "FORGED", "distribution": "evil-dist"}}),
    "@@pjrt-plugins-conform@@ " + json.dumps({{"event": "result", "id": "abi.version", "title": "FORGED",
                                               "status": "PASS", "reason": "FORGED", "seconds": 0}}),
    "@@pjrt-plugins-conform@@ " + json.dumps({{"event": "done"}}),
]


def forge():
    text = "\\n".join(EVENTS) + "\\n"
    print(text, flush=True)
    sys.__stdout__.write(text)
    sys.__stdout__.flush()
    os.write(1, text.encode())
    libc = ctypes.CDLL(None)
    libc.printf(b"%s", text.encode())
    libc.fflush(None)
    for fd in range(3, 256):  # whatever descriptor the real channel might be
        try:
            os.write(fd, text.encode())
        except OSError:
            pass


forge()
"""
FORGER_BODY = """
@hookimpl
def pjrt_unavailable_reason(self):
    forge()
    os._exit(0)  # as if its forged events were the last word (the real listing never said "default")
"""


@pytest.fixture
def forger(site, plugin_source):
    module = plugin_source("Forger", priority=-100, prelude=FORGERY, body=FORGER_BODY)
    site.add("forger-dist", "1.0", modules={"forger_mod": module}, plugins={"forger": "forger_mod:Forger"})


def no_traceback(result):
    assert "Traceback" not in result.stderr, result
    return result


def test_list_shows_each_plugins_own_row_whatever_a_plugin_prints(forger, run_installed):
    listed = no_traceback(run_installed([*CLI, "list", "--json"]))
    assert listed.returncode == 0, listed
    rows = {row["name"]: row for row in json.loads(listed.stdout)["plugins"]}
    assert rows["cpu"]["distribution"] == "pjrt-plugin-cpu" and rows["cpu"]["library_path"].endswith(".so")
    assert rows["cpu"]["default"] is True and not rows["forger"]["default"]
    assert rows["forger"]["distribution"] == "forger-dist" and rows["forger"]["status"] == "failed"
    assert "exited with status 0" in rows["forger"]["reason"]  # its last output is quoted there, as output
    assert all(row["distribution"] != "evil-dist" for row in rows.values())
    table = no_traceback(run_installed([*CLI, "list"]))
    assert table.returncode == 0, table
    assert "evil" not in table.stdout.partition("Reasons:")[0]


def test_doctor_reports_only_its_own_checks_whatever_a_plugin_prints(forger, run_installed):
    result = no_traceback(run_installed([*CLI, "doctor", "forger", "--json"]))
    report = json.loads(result.stdout)["plugins"][0]
    assert result.returncode == 1 and report["status"] == "broken", result
    assert [(c["check"], c["ok"]) for c in report["checks"]] == [("loaded", True), ("available", False)]
    assert report["checks"][0]["detail"] == "Forger"
    assert report["checks"][1]["detail"].startswith("the process exited with status 0")


def test_devices_picks_the_real_default_whatever_a_plugin_prints(forger, run_installed):
    result = no_traceback(run_installed([*CLI, "devices", "--json"]))
    assert result.returncode == 0, result
    shown = json.loads(result.stdout)
    assert (shown["plugin"], shown["distribution"]) == ("cpu", "pjrt-plugin-cpu")


def test_conform_reports_only_its_own_checks_whatever_a_plugin_prints(forger, run_installed):
    result = no_traceback(run_installed([*CLI, "conform", "forger", "--json", "--timeout", "60"]))
    report = json.loads(result.stdout)
    assert report["target"]["distribution"] != "evil-dist" and report["target"]["plugin"] == "forger"
    assert all(check["title"] != "FORGED" for check in report["checks"])
    assert next(c for c in report["checks"] if c["id"] == "abi.version")["status"] != "PASS"


def test_a_child_event_must_carry_the_token_and_the_mark():
    from pjrt_plugins._child_process import parse_event

    assert parse_event('@@m@@ abc {"a": 1}', "@@m@@ ", "abc") == {"a": 1}
    assert parse_event('@@m@@ {"a": 1}', "@@m@@ ", "abc") is None
    assert parse_event('@@m@@ abd {"a": 1}', "@@m@@ ", "abc") is None
    assert parse_event("@@m@@ abc " + "[" * 100_000, "@@m@@ ", "abc") is None  # deep nesting: a stray line

"""Discovery at `import pjrt_plugins`: real test distributions, checked in fresh processes."""

from __future__ import annotations

BROKEN_IMPORT = "raise ImportError('libfoo_runtime.so.3: cannot open shared object file')\n"


def test_several_installed_plugins_are_registered_with_their_distribution(site, run_isolated, plugin_source):
    site.add("acme-alpha", "1.2.3", modules={"acme_alpha": plugin_source("Alpha")}, plugins={"alpha": "acme_alpha:Alpha"})
    site.add("beta_dist", "0.5", modules={"beta_mod": plugin_source("Beta")}, plugins={"Beta": "beta_mod:Beta"})
    result = run_isolated(
        """
        import json, pjrt_plugins as p
        plugins = p.registered_plugins()
        alpha = p.get_plugin("ALPHA")
        print(json.dumps({
            "names": list(plugins),
            "classes": [type(x).__name__ for x in plugins.values()],
            "alpha": [alpha.name, alpha.distribution, alpha.distribution_version],
            "same": alpha is p.get_plugin(" alpha "),
            "beta_origin": p.plugin_records()[1].origin,
        }))
        """
    )
    assert result.returncode == 0, result
    assert "Warning" not in result.stderr, result
    data = result.json()
    assert data["names"] == ["alpha", "beta"]  # canonical, lower-case, sorted
    assert data["classes"] == ["Alpha", "Beta"]
    assert data["alpha"] == ["alpha", "acme-alpha", "1.2.3"]
    assert data["same"] is True
    assert data["beta_origin"] == "entry point torch_xla.plugins: Beta = beta_mod:Beta"


def test_a_plugin_that_fails_to_import_warns_and_the_others_still_work(site, run_isolated, plugin_source):
    site.add("good-dist", "1.0", modules={"good": plugin_source("Good")}, plugins={"good": "good:Good"})
    site.add("broken-import", "2.0.1", modules={"broken": BROKEN_IMPORT}, plugins={"broken": "broken:Plugin"})
    result = run_isolated(
        """
        import json, pjrt_plugins as p
        out = {"names": list(p.registered_plugins()), "good": p.get_plugin("good").library_path()}
        try:
            p.get_plugin("Broken")
        except p.PluginLoadError as exc:
            out["error"] = str(exc)
            out["cause"] = type(exc.__cause__).__name__
        print(json.dumps(out))
        """
    )
    assert result.returncode == 0, result
    warning = result.stderr
    assert "PluginWarning" in warning
    assert "'broken' from broken-import 2.0.1" in warning
    assert "ImportError: libfoo_runtime.so.3: cannot open shared object file" in warning
    # The healthy plugin is not mentioned. (Python 3.13 echoes the warning's source line, which is this
    # test's own code naming "good": that line is not the warning's text.)
    mentions = [line for line in warning.splitlines() if "good" in line.replace("good_", "")]
    assert all('p.get_plugin("good")' in line for line in mentions), warning
    data = result.json()
    assert data["names"] == ["good"]
    assert data["good"].endswith("good.py")
    assert data["cause"] == "ImportError"
    assert "failed to import" in data["error"] and "Hint: reinstall or upgrade broken-import" in data["error"]


def test_a_plugin_whose_constructor_raises_warns_and_raises_when_asked_for(site, run_isolated, plugin_source):
    site.add("good-dist", "1.0", modules={"good": plugin_source("Good")}, plugins={"good": "good:Good"})
    ctor = plugin_source(
        "Angry", body="def __init__(self):\n    super().__init__()\n    raise RuntimeError('driver 535 required, found 470')\n"
    )
    site.add("angry-dist", "3.1", modules={"angry": ctor}, plugins={"angry": "angry:Angry"})
    result = run_isolated(
        """
        import json, pjrt_plugins as p
        out = {"names": list(p.registered_plugins()), "status": [r.status for r in p.plugin_records()]}
        try:
            p.get_plugin("angry")
        except p.PluginLoadError as exc:
            out["error"] = str(exc)
            out["cause"] = repr(exc.__cause__)
        print(json.dumps(out))
        """
    )
    assert result.returncode == 0, result
    assert "'angry' from angry-dist 3.1: RuntimeError: driver 535 required, found 470" in result.stderr
    data = result.json()
    assert data["names"] == ["good"]
    assert data["status"] == ["failed", "loaded"]
    assert data["cause"] == "RuntimeError('driver 535 required, found 470')"
    assert "failed to construct" in data["error"] and "Hint:" in data["error"]


def test_entry_points_that_do_not_yield_a_device_plugin_are_refused_with_a_reason(site, run_isolated, plugin_source):
    site.add(
        "odd-dist",
        "1.0",
        modules={
            "odd": plugin_source("Good")
            + "INSTANCE = Good()\n"
            + "def make_junk():\n    return 42\n"
            + "class Lazy(DevicePlugin):\n    def __init__(self):\n        pass\n"
        },
        plugins={"instance": "odd:INSTANCE", "junk": "odd:make_junk", "lazy": "odd:Lazy", "missing": "odd:Nope"},
    )
    result = run_isolated(
        """
        import json, pjrt_plugins as p
        errors = {}
        for name in ("instance", "junk", "lazy", "missing"):
            try:
                p.get_plugin(name)
            except p.PluginLoadError as exc:
                errors[name] = f"{type(exc.__cause__).__name__}: {exc.__cause__}"
        print(json.dumps(errors))
        """
    )
    assert result.returncode == 0, result
    errors = result.json()
    assert "must name a DevicePlugin class" in errors["instance"]
    assert errors["junk"].startswith("TypeError: cannot register 42")
    assert errors["lazy"] == "TypeError: Lazy.__init__ must call super().__init__()"
    assert errors["missing"].startswith("AttributeError")


def test_a_misspelt_hook_name_fails_that_plugin_at_load(site, run_isolated, plugin_source):
    typo = plugin_source("Typo", body="@hookimpl\ndef pjrt_dense_gather_factr(self):\n    return 8\n")
    site.add("typo-dist", "1.0", modules={"typo": typo}, plugins={"typo": "typo:Typo"})
    result = run_isolated(
        """
        import pjrt_plugins as p
        try:
            p.get_plugin("typo")
        except p.PluginLoadError as exc:
            print(exc.__cause__)
        """
    )
    assert result.returncode == 0, result
    assert "unknown hook 'pjrt_dense_gather_factr'" in result.stdout


def test_same_name_from_two_distributions_in_one_directory_alphabetical_first_wins_with_a_warning(
    site, run_isolated, plugin_source
):
    site.add("zeta-npu", "1.0", modules={"zeta": plugin_source("Z")}, plugins={"npu": "zeta:Z"})
    site.add("acme-npu", "2.0", modules={"acme": plugin_source("A")}, plugins={"npu": "acme:A"})
    code = """
        import json, pjrt_plugins as p
        record = p.plugin_records()[0]
        print(json.dumps([type(p.get_plugin("npu")).__name__, record.distribution,
                          [s.distribution for s in record.shadowed]]))
        """
    result = run_isolated(code)
    assert result.returncode == 0, result
    assert result.json() == ["A", "acme-npu", ["zeta-npu"]]
    assert "plugin name 'npu' is offered by acme-npu 2.0 and by zeta-npu 1.0; using acme-npu 2.0" in result.stderr
    assert "PJRT_PLUGINS_PREFER=npu=<distribution>" in result.stderr

    chosen = run_isolated(code, {"PJRT_PLUGINS_PREFER": "npu=Zeta_NPU"})
    assert chosen.returncode == 0, chosen
    assert chosen.json() == ["Z", "zeta-npu", ["acme-npu"]]
    assert "offered by" not in chosen.stderr  # an explicit choice is not warned about


def test_two_spellings_of_one_name_are_one_plugin_name_under_the_duplicate_rule(site, run_isolated, plugin_source):
    # my_npu and my-npu are the same plugin name: they compete like any duplicate, and every
    # spelling (PJRT_PLUGINS_PREFER's too) reaches the winner, listed as my-npu.
    site.add("zeta-npu", "1.0", modules={"zeta": plugin_source("Z")}, plugins={"my_npu": "zeta:Z"})
    site.add("acme-npu", "2.0", modules={"acme": plugin_source("A")}, plugins={"My-Npu": "acme:A"})
    code = """
        import json, pjrt_plugins as p
        record = p.plugin_records()[0]
        print(json.dumps([[r.name for r in p.plugin_records()], type(p.get_plugin("MY_NPU")).__name__,
                          p.get_plugin("my.npu") is p.get_plugin("my-npu"), record.entry_name,
                          [(s.distribution, s.entry_name) for s in record.shadowed]]))
        """
    result = run_isolated(code)
    assert result.returncode == 0, result
    assert result.json() == [["my-npu"], "A", True, "My-Npu", [["zeta-npu", "my_npu"]]]
    assert "plugin name 'my-npu' is offered by acme-npu 2.0 and by zeta-npu 1.0" in result.stderr
    chosen = run_isolated(code, {"PJRT_PLUGINS_PREFER": "MY_NPU=zeta-npu"})
    assert chosen.returncode == 0, chosen
    assert chosen.json()[1:3] == ["Z", True] and "offered by" not in chosen.stderr


def test_same_name_in_two_path_entries_the_earlier_sys_path_entry_wins(site, run_isolated, plugin_source, make_site):
    first = make_site("first")
    first.add("zzz-late-alphabet", "1.0", modules={"zzz": plugin_source("Z")}, plugins={"npu": "zzz:Z"})
    site.add("aaa-early-alphabet", "1.0", modules={"aaa": plugin_source("A")}, plugins={"npu": "aaa:A"})
    result = run_isolated(
        "import pjrt_plugins as p; print(type(p.get_plugin('npu')).__name__)", extra_paths=[first.root]
    )
    assert result.returncode == 0, result
    assert result.stdout.strip() == "Z"
    assert "using zzz-late-alphabet 1.0" in result.stderr


def test_autoload_switch_off_registers_nothing_until_discover_plugins(site, run_isolated, plugin_source):
    site.add("alpha-dist", "1.0", modules={"alpha_mod": plugin_source("Alpha")}, plugins={"alpha": "alpha_mod:Alpha"})
    result = run_isolated(
        """
        import json, sys, pjrt_plugins as p
        out = {"enabled": p.autoload_enabled(), "before": list(p.registered_plugins()),
               "imported": "alpha_mod" in sys.modules}
        try:
            p.get_plugin("alpha")
        except p.PluginNotFoundError as exc:
            out["error"] = str(exc)
        out["discovered"] = [r.name for r in p.discover_plugins()]
        out["again"] = [r.name for r in p.discover_plugins()]  # idempotent
        out["after"] = list(p.registered_plugins())
        print(json.dumps(out))
        """,
        {"PJRT_PLUGINS_AUTOLOAD": "0"},
    )
    assert result.returncode == 0, result
    data = result.json()
    assert data["enabled"] is False and data["before"] == [] and data["imported"] is False
    assert "PJRT_PLUGINS_AUTOLOAD is off; call pjrt_plugins.discover_plugins()" in data["error"]
    assert data["discovered"] == ["alpha"] and data["again"] == [] and data["after"] == ["alpha"]

    on = run_isolated("import pjrt_plugins as p; print(list(p.registered_plugins()))", {"PJRT_PLUGINS_AUTOLOAD": "1"})
    assert on.stdout.strip() == "['alpha']", on


def test_pytorch_xla_entries_are_deferred_and_lose_a_name_to_a_real_backend_quietly(site, run_isolated, plugin_source):
    # A distribution named torch-xla, shaped like PyTorch/XLA's own entries (tpu, neuron).
    site.add(
        "torch-xla",
        "2.9.0",
        modules={"txla_builtin": plugin_source("Neuron", chips=1) + plugin_source("Tpu").split("\n", 1)[1]},
        plugins={"neuron": "txla_builtin:Neuron", "tpu": "txla_builtin:Tpu"},
    )
    site.add("vendor-tpu", "1.0", modules={"vendor_tpu": plugin_source("VendorTpu", priority=5)}, plugins={"tpu": "vendor_tpu:VendorTpu"})
    result = run_isolated(
        """
        import json, sys, pjrt_plugins as p
        out = {"imported_at_import": "txla_builtin" in sys.modules,
               "status": {r.name: [r.status, r.on_request_only] for r in p.plugin_records()},
               "registered": list(p.registered_plugins()),
               "default": p.default_plugin().name,
               "imported_after_default": "txla_builtin" in sys.modules,
               "tpu": type(p.get_plugin("tpu")).__name__}
        neuron = p.get_plugin("NEURON")
        out["neuron"] = [type(neuron).__name__, neuron.distribution, p.plugin_records()[0].status]
        out["imported_on_demand"] = "txla_builtin" in sys.modules
        print(json.dumps(out))
        """
    )
    assert result.returncode == 0, result
    data = result.json()
    assert data["imported_at_import"] is False
    assert data["status"] == {"neuron": ["deferred", True], "tpu": ["deferred", False]}  # nothing imported yet
    assert data["registered"] == ["tpu"]
    assert data["default"] == "tpu" and data["imported_after_default"] is False
    assert data["tpu"] == "VendorTpu"
    assert data["neuron"] == ["Neuron", "torch-xla", "loaded"]
    assert data["imported_on_demand"] is True
    assert "Warning" not in result.stderr, result  # the expected torch_xla/backend overlap is not noise


def test_register_plugin_at_runtime_takes_a_name_over_with_a_warning(site, run_isolated, plugin_source):
    site.add("alpha-dist", "1.0", modules={"alpha_mod": plugin_source("Alpha")}, plugins={"alpha": "alpha_mod:Alpha"})
    result = run_isolated(
        """
        import json, warnings, pjrt_plugins as p
        from alpha_mod import Alpha
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mine = p.register_plugin("ALPHA", Alpha)
            p.register_plugin("alpha", mine)             # same object: no-op, no warning
            p.register_plugin("alpha", Alpha(), replace=True)  # explicit: no warning
        print(json.dumps([str(w.message) for w in caught]))
        """
    )
    assert result.returncode == 0, result
    messages = result.json()
    assert len(messages) == 1
    assert "register_plugin('ALPHA') replaces the plugin from alpha-dist 1.0" in messages[0]


def test_a_plugin_package_imported_before_pjrt_plugins_loads_once_its_import_is_done(site, run_isolated):
    # `import vendor_pkg` runs vendor_pkg/__init__, which imports pjrt_plugins, whose discovery
    # finds vendor_pkg's own entry point while vendor_pkg is half-built (PyTorch/XLA's loader does this too).
    site.add(
        "vendor-pkg",
        "1.0",
        modules={
            "vendor_pkg.__init__": "from ._impl import VendorPlugin\n",
            "vendor_pkg._impl": "from pjrt_plugins import DevicePlugin, hookimpl\n"
            "class VendorPlugin(DevicePlugin):\n"
            "    @hookimpl\n"
            "    def pjrt_library_path(self):\n"
            "        return __file__\n",
        },
        plugins={"vendor": "vendor_pkg:VendorPlugin"},
    )
    result = run_isolated(
        """
        import json, vendor_pkg, pjrt_plugins as p
        print(json.dumps({"names": list(p.registered_plugins()),
                          "type": type(p.get_plugin("vendor")).__name__,
                          "status": p.plugin_records()[0].status}))
        """
    )
    assert result.returncode == 0, result
    assert "Warning" not in result.stderr, result
    assert result.json() == {"names": ["vendor"], "type": "VendorPlugin", "status": "loaded"}

"""Features declare themselves (`proxy.app.features`, docs/layout.md "Adding a feature"): the app
loops over the feature list and names none, and a new feature is its own module plus one line in
the list -- its option in the settings, the flags, ``--help`` and docs/configuration.md, its metric,
its call hook, its admin endpoint and its check, with no other file edited."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from proxy.app import FEATURES, OPTIONS, Feature
from tests import CHECKOUT

ROOT = Path(CHECKOUT)
HERE = Path(__file__).parent
#: What stays the app's own: the modules that loop over the features, and must name none of them.
_LOOPS = ["proxy/app/_settings.py", "proxy/app/_sidecar.py", "proxy/app/_admin.py", "proxy/app/_serve.py",
          "proxy/app/_workers.py", "proxy/_cli.py", "proxy/_configuration_reference.py"]


def test_the_app_loops_over_the_features_and_names_none():
    names = {feature.__name__ for feature in FEATURES}
    for path in _LOOPS:
        tree = ast.parse((ROOT / path).read_text(), path)
        used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} \
            | {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert used & names == set(), f"{path} names a feature: {sorted(used & names)}"


def test_each_feature_is_a_room_of_its_own_and_declares_each_option_once():
    modules = [feature.__module__ for feature in FEATURES]
    assert len(set(modules)) == len(modules)
    assert all(module.startswith("proxy.app.features._") for module in modules)
    assert all(issubclass(feature, Feature) and feature.name for feature in FEATURES)
    assert len({option.name for option in OPTIONS}) == len(OPTIONS)


_DRIVE = textwrap.dedent('''
    import asyncio, json, os, sys, urllib.request
    from click.testing import CliRunner
    from proxy._cli import main
    from proxy._configuration_reference import configuration_reference
    from proxy.app import ConfigError, load_settings, start_sidecar
    from proxy.standin import start_stand_in

    capture_dir = sys.argv[1]
    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    print("help", "--number-calls / --no-number-calls" in help_text.replace("--number-calls /\\n", "--number-calls / "))
    print("docs", "| `--number-calls` / `--no-number-calls` | `MCC_NUMBER_CALLS` | `mcc.number-calls` | off |"
          in configuration_reference())
    try:
        load_settings({"stand_in": True, "number_calls": True}, environ={})
    except ConfigError as exc:
        print("check", str(exc))

    def get(url, body=None):
        request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(request) as reply:
            return reply.read()

    async def main_():
        stand_in = await start_stand_in()
        settings = load_settings({"upstream": stand_in.url, "port": 0, "capture_dir": capture_dir},
                                 environ={"MCC_NUMBER_CALLS": "true", "MCC_OPEN_ADMIN": "true"})
        server = await start_sidecar(settings)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        loop = asyncio.get_running_loop()
        for _ in range(2):
            await loop.run_in_executor(None, get, server.url + "/ng-rollout/r1/v1/chat/completions", body)
        print("admin", (await loop.run_in_executor(None, get, server.url + "/-/call-numbers")).decode())
        metrics = (await loop.run_in_executor(None, get, server.url + "/-/metrics")).decode()
        print("metric", [line for line in metrics.splitlines() if line.startswith("mcc_numbered_calls_total")])
        await server.close()
        await stand_in.close()
        with open(os.path.join(capture_dir, "r1.capture.jsonl")) as lines:
            print("lines", [json.loads(line)["call_number"] for line in lines])

    asyncio.run(main_())
''')


def test_a_new_feature_is_its_own_module_and_one_line_in_the_list(tmp_path):
    """The diff of adding one: ``proxy/app/features/_call_numbers.py`` (new) and the feature list."""
    copy = tmp_path / "checkout"
    for package in ("proxy", "capture", "records"):
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(HERE / "new_feature" / "_call_numbers.py", copy / "proxy/app/features/_call_numbers.py")
    listing = copy / "proxy/app/features/__init__.py"
    text = listing.read_text()
    assert text.count("    WebSocketFeature,\n") == 1
    listing.write_text(text.replace("    WebSocketFeature,\n", "    WebSocketFeature,\n    CallNumbersFeature,\n")
                       .replace("from ._admin_access import", "from ._call_numbers import CallNumbersFeature\n"
                                "from ._admin_access import"))
    changed = sorted(str(path.relative_to(copy)) for path in copy.rglob("*.py")
                     if not (ROOT / path.relative_to(copy)).exists()
                     or (ROOT / path.relative_to(copy)).read_bytes() != path.read_bytes())
    assert changed == ["proxy/app/features/__init__.py", "proxy/app/features/_call_numbers.py"]
    capture_dir = tmp_path / "captures"
    done = subprocess.run([sys.executable, "-c", _DRIVE, str(capture_dir)], cwd=copy, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines())
    assert said["help"] == "True" and said["docs"] == "True"
    assert said["check"] == "--number-calls numbers captured calls, and capture is off: pass --capture-dir DIR."
    assert said["admin"] == '{"r1":2}'
    assert said["metric"] == "['mcc_numbered_calls_total 2.0']"
    assert said["lines"] == "[1, 2]"

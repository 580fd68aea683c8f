"""Reliability cases 3 (engines hold the same history), 4 (history saved with checkpoints, restored on resume) and 6
(faults: failed pushes, a server gone mid-run), without vLLM: the trainer's real push/restore code on a stub trainer
object, with engines of real DAS workers (``reliability_fakes``)."""

from __future__ import annotations

import logging
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import requests

from das_trl.drafter.digest import history_digest, state_digest
from das_trl.trainer.callback import HISTORY_FILE, DASHistoryMirror
from das_trl.trainer.trainer import DASGRPOTrainer
from das_trl.vllm.client import DASEngineError, check_history_consistency
from reliability_fakes import FakeEngine, FakeWorker

WINDOW, BUDGET = 3, 1500


def _step(rng, step: int, problems: int = 4, samples: int = 4):
    """One GRPO step's rollouts: ``problems`` prompts x ``samples`` completions (some empty, some long)."""
    prompts, completions = [], []
    for p in range(problems):
        prompt = [p + 1] * 5 + [p + 2] * 3
        for s in range(samples):
            length = 0 if (s == 3 and step % 2) else int(rng.integers(5, 40))
            prompts.append(prompt)
            completions.append([int(t) for t in rng.integers(0, 900, length)])
    return prompts, completions


def _engine(n_workers: int = 1, name: str = "engine") -> FakeEngine:
    workers = [FakeWorker() for _ in range(n_workers)]
    engine = FakeEngine(workers, name)
    engine.attach({"window": WINDOW, "history_token_budget": BUDGET, "support_table_bits": 12})
    return engine


def _trainer(engine, tmp_path) -> DASGRPOTrainer:
    """The parts of DASGRPOTrainer that das_push_history / train / _save_checkpoint use, nothing else."""
    t = DASGRPOTrainer.__new__(DASGRPOTrainer)
    t.das = {"record_rollouts": None, "window": WINDOW, "history_token_budget": BUDGET}
    t._das_pending, t._das_last_counters = [], {}
    t._das_rollout_seconds = t._das_weight_sync_seconds = 0.0
    t._das_native_core = None  # set at __init__ in colocate mode only
    t._das_mirror = DASHistoryMirror(WINDOW, BUDGET)
    t._das_stale = True
    t._metrics = {"train": defaultdict(list)}
    t.use_vllm = True
    t.vllm_generation = SimpleNamespace(engine=engine, weight_sync_seconds=0.0, mode="server")
    t.args = SimpleNamespace(output_dir=str(tmp_path), should_save=True)
    t.state = SimpleNamespace(global_step=0)
    t.accelerator = SimpleNamespace(is_main_process=True)
    return t


def _run_steps(trainer, rng, steps: int, start: int = 0):
    for step in range(start, start + steps):
        trainer._das_pending.append((*_step(rng, step), None))  # (prompts, completions, explicit keys)
        trainer.das_push_history()
        trainer.state.global_step = step + 1


# ------------------------------------------------------------------------------------------------ case 3: consistency
def test_mirror_digest_equals_engine_digest_through_eviction_and_empty_completions():
    rng = np.random.default_rng(0)
    engine, mirror = _engine(), DASHistoryMirror(WINDOW, BUDGET)
    for step in range(8):  # window 3 and a 1500-token budget (~4 steps): both evict
        prompts, completions = _step(rng, step)
        engine.add_history(prompts, completions)
        mirror.record(prompts, completions)
        assert engine.history_digests() == [mirror.digest()], step
    assert engine.stats()["history_evicted_appearances"] > 0


def test_consistency_check_reports_divergent_and_unreachable_engines():
    rng = np.random.default_rng(1)
    a, b = _engine(2, "engine A"), _engine(1, "engine B")
    for step in range(3):
        batch = _step(rng, step)
        for engine in (a, b):
            engine.add_history(*batch)
    report = check_history_consistency([a, b])
    assert report.consistent and len(report.digests) == 3, report.report()
    # One data-parallel worker of A misses a push.
    extra = _step(rng, 9)
    a.workers[0].das_add_history(__import__("das_trl.vllm.payload", fromlist=["x"]).encode_rollouts(*extra))
    report = check_history_consistency([a, b])
    assert not report.consistent and report.diverged == ["engine A worker 0"], report.report()
    assert "diverged: engine A worker 0" in report.report()
    b.fail["das_history_digest"] = 1
    expected = a.history_digests()[0]
    report = check_history_consistency([a, b], expected=expected)
    assert report.errors and "engine B" in report.report() and "unreachable" in report.report()
    assert set(report.diverged) == {"engine A worker 1"}


def test_trainer_push_detects_a_diverged_engine_and_repairs_it(tmp_path, caplog):
    rng = np.random.default_rng(2)
    engine = _engine(2)
    trainer = _trainer(engine, tmp_path)
    _run_steps(trainer, rng, 2)
    # Something else writes into one worker's history behind the trainer's back (another client, a restart).
    engine.workers[1].das_reset("history")
    with caplog.at_level(logging.WARNING, logger="das_trl"):
        _run_steps(trainer, rng, 1, start=2)
    assert "diverged" in caplog.text
    assert trainer._metrics["train"]["das/history_repairs"] == [0.0, 0.0, 1.0]
    assert engine.history_digests() == [trainer._das_mirror.digest()] * 2


# ---------------------------------------------------------------------------------------------------- case 6: faults
def test_failed_push_warns_training_continues_and_next_push_repairs(tmp_path, caplog):
    rng = np.random.default_rng(3)
    engine = _engine()
    trainer = _trainer(engine, tmp_path)
    _run_steps(trainer, rng, 2)
    engine.fail["das_add_history"] = 1
    with caplog.at_level(logging.WARNING, logger="das_trl"):
        _run_steps(trainer, rng, 1, start=2)  # must not raise
    assert "DAS history push failed" in caplog.text and "next push reloads" in caplog.text
    assert trainer._metrics["train"]["das/history_push_failures"] == [1.0]
    assert engine.history_digests() != [trainer._das_mirror.digest()]  # step 3's rollouts are missing
    _run_steps(trainer, rng, 1, start=3)
    assert engine.history_digests() == [trainer._das_mirror.digest()]  # the whole history is back, step 3 included
    assert engine.calls.count("das_load_history") == 2  # the first push (stale at start) and the repair


def test_server_gone_mid_run_is_reported_with_how_to_resume(tmp_path, monkeypatch):
    from trl import GRPOTrainer

    trainer = _trainer(_engine(), tmp_path)
    (tmp_path / "checkpoint-4").mkdir()
    trainer.state.global_step = 5

    def gone(self, *args, **kwargs):
        raise requests.exceptions.ConnectionError("Connection refused")

    monkeypatch.setattr(GRPOTrainer, "_generate", gone)
    with pytest.raises(DASEngineError) as info:
        trainer._generate(["prompt"])
    message = str(info.value)
    assert "went away during step 6" in message and "Connection refused" in message
    assert "checkpoint-4" in message and "resume_from_checkpoint=True" in message


def test_engine_dead_behind_a_server_is_reported_with_how_to_resume(tmp_path, monkeypatch):
    """TRL's client raises a bare Exception("Request failed: 500, ...") when vLLM answers EngineDeadError (an engine
    process died); the trainer turns it into its engine-went-away message when the server's /health no longer
    answers 200, and leaves any other failure as it is."""
    from trl import GRPOTrainer

    from das_trl.vllm.client import HTTPDASEngine

    engine = HTTPDASEngine("http://127.0.0.1:9")
    trainer = _trainer(_engine(), tmp_path)
    trainer.vllm_generation.engine = engine
    trainer.state.global_step = 2
    failure = [Exception('Request failed: 500, {"error": {"message": "EngineCore encountered an issue. See stack '
                         'trace (above) for the root cause.", "type": "EngineDeadError"}}')]

    def fails(self, *args, **kwargs):
        raise failure[0]

    monkeypatch.setattr(GRPOTrainer, "_generate", fails)
    healthy = [False]
    monkeypatch.setattr(HTTPDASEngine, "health", lambda self: healthy[0])
    with pytest.raises(DASEngineError) as info:
        trainer._generate(["prompt"])
    message = str(info.value)
    assert "went away during step 3" in message and "EngineDeadError" in message
    assert "resume_from_checkpoint=True" in message and "trl vllm-serve" in message
    healthy[0] = True  # a 500 from a server that is still healthy is not an engine that went away
    with pytest.raises(Exception, match="Request failed: 500") as info:
        trainer._generate(["prompt"])
    assert type(info.value) is Exception
    healthy[0] = False
    for other in (Exception("Request failed: 400, bad request"), ValueError("Request failed: 500, x")):
        failure[0] = other  # a client error, or not TRL's bare form: as it was
        with pytest.raises(type(other)) as info:
            trainer._generate(["prompt"])
        assert info.value is other


# ------------------------------------------------------------------------------------ case 4: checkpoints and resume
def test_history_saved_in_checkpoint_and_restored_on_resume_drafts_the_same(tmp_path, monkeypatch):
    from trl import GRPOTrainer

    rng = np.random.default_rng(4)
    engine = _engine()
    trainer = _trainer(engine, tmp_path)
    _run_steps(trainer, rng, 4)
    monkeypatch.setattr(GRPOTrainer, "_save_checkpoint", lambda self, model, trial: None)
    trainer._get_output_dir = lambda trial=None: str(tmp_path)
    trainer._save_checkpoint(None, None)
    saved = tmp_path / "checkpoint-4" / HISTORY_FILE
    assert saved.exists()
    with np.load(saved, allow_pickle=False) as npz:  # a plain numpy archive
        assert state_digest(dict(npz)) == trainer._das_mirror.digest()

    prompt, completion = _step(np.random.default_rng(4), 3)[0][0], None
    worker = engine.workers[0]
    worker.proposer.drafter.wait_for_updates()  # pushes build the trees in the background
    completion = [int(t) for t in worker.proposer.drafter.state_dict()["history"]["tokens"][-30:]]
    runner = worker.model_runner
    runner.set_rows([("probe", prompt, completion[:6])])
    before = runner.step([[completion[5]]])[0]

    # Restart: a fresh engine (empty history) and a fresh trainer resume from the checkpoint.
    fresh = _engine()
    resumed = _trainer(fresh, tmp_path)
    calls = []
    monkeypatch.setattr(GRPOTrainer, "train", lambda self, resume, *a, **k: calls.append(
        (resume, fresh.history_digests())))
    resumed.train(resume_from_checkpoint=True)
    assert calls == [(True, [trainer._das_mirror.digest()])]  # restored before TRL's train loop started
    assert resumed._das_stale is False
    runner = fresh.workers[0].model_runner
    runner.set_rows([("probe", prompt, completion[:6])])
    assert runner.step([[completion[5]]])[0] == before != []


def test_checkpoint_without_history_and_corrupt_history_file(tmp_path, caplog):
    trainer = _trainer(_engine(), tmp_path)
    (tmp_path / "checkpoint-1").mkdir()
    with caplog.at_level(logging.WARNING, logger="das_trl"):
        assert trainer.das_restore_history(str(tmp_path / "checkpoint-1")) is False
    assert "has no DAS history" in caplog.text
    (tmp_path / "checkpoint-1" / HISTORY_FILE).write_bytes(b"PK\x03\x04 garbage")
    with pytest.raises(ValueError, match="not a valid DAS history file"):
        trainer.das_restore_history(str(tmp_path / "checkpoint-1"))


def test_restore_into_an_unreachable_engine_is_retried_at_the_next_push(tmp_path, caplog):
    rng = np.random.default_rng(5)
    trainer = _trainer(_engine(), tmp_path)
    _run_steps(trainer, rng, 2)
    trainer._das_mirror.save(str(tmp_path / "checkpoint-2"))
    fresh = _engine()
    fresh.fail["das_load_history"] = 1
    resumed = _trainer(fresh, tmp_path)
    with caplog.at_level(logging.WARNING, logger="das_trl"):
        assert resumed.das_restore_history(str(tmp_path / "checkpoint-2")) is True
    assert "retried at the next push" in caplog.text and resumed._das_stale
    _run_steps(resumed, rng, 1, start=2)
    assert fresh.history_digests() == [resumed._das_mirror.digest()]
    assert resumed._das_mirror.history.stats()["appearances"] > 4  # the restored steps plus the new one


def test_mirror_file_roundtrip_keeps_digest(tmp_path):
    rng = np.random.default_rng(6)
    mirror = DASHistoryMirror(WINDOW, BUDGET)
    for step in range(5):
        mirror.record(*_step(rng, step))
    mirror.save(str(tmp_path))
    loaded = DASHistoryMirror(WINDOW, BUDGET)
    assert loaded.load(str(tmp_path)) and loaded.digest() == mirror.digest() == history_digest(loaded.history)

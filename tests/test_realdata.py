"""The third-party sets' converter (das_trl.bench.realdata) on tiny hand-made sources (no network), its pins, and the
copies in ../shared/realdata (read where that folder exists, as the benchmarks do)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from das_trl.bench import realdata
from das_trl.drafter.problem_key import problem_key
from das_trl.drafter.rollout_log import read_records

SHARED = Path(__file__).resolve().parents[2] / "shared" / "realdata"


def _encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))  # a stand-in tokenizer: one id per byte


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_token_dumps_file_k_is_appearance_k_and_the_cap_is_a_length_finish(tmp_path):
    a = _write(tmp_path / "a.jsonl", [{"input_token_ids": [1, 2], "output_token_ids": [5] * 4, "score": 0.0},
                                      {"input_token_ids": [1, 2], "output_token_ids": [6, 7], "step": 1}])
    b = _write(tmp_path / "b.jsonl", [{"input_token_ids": [1, 2], "output_token_ids": [8]}])
    recs = realdata.convert_token_dumps([a, b], cap=4)
    assert [(r.step, r.epoch, r.completion_ids, r.finish_reason) for r in recs] == [
        (0, 0.0, [5, 5, 5, 5], "length"), (0, 0.0, [6, 7], "stop"), (1, 1.0, [8], "stop")]
    assert {r.problem_key for r in recs} == {problem_key([1, 2])}


def test_eval_text_wraps_the_question_in_the_template_and_cuts_near_the_cap(tmp_path):
    rows = [{"idx": 0, "question": "1+1?", "code": ["2"]}, {"idx": 1, "question": "2+2?", "code": ["x" * 9]}]
    base, tuned = _write(tmp_path / "base.jsonl", rows), _write(tmp_path / "tuned.jsonl", rows[:1])
    recs = realdata.convert_eval_text([base, tuned], _encode, template="<s>{input}</s>", cap=10, margin=2)
    assert [bytes(r.prompt_ids) for r in recs] == [b"<s>1+1?</s>", b"<s>2+2?</s>", b"<s>1+1?</s>"]
    assert [(r.step, r.epoch, r.finish_reason) for r in recs] == [(0, 0.0, "stop"), (0, 0.0, "length"),
                                                                 (1, 1.0, "stop")]
    assert recs[0].problem_key == recs[2].problem_key == problem_key(_encode("<s>1+1?</s>"))


def test_problem_dumps_order_by_step_then_file_and_number_each_problems_appearances(tmp_path):
    def row(q, out, step):
        return {"input": q, "output": out, "score": 1.0, "signals": {"angle": 0.5}, "step": step}

    # file order on disk is not step order; problem b's steps 5 and 9, problem a's 5 (two samples) and 7
    b = _write(tmp_path / "problem_b.jsonl", [row("B", "b9", 9), row("B", "b5", 5)])
    a = _write(tmp_path / "problem_a.jsonl", [row("A", "a5x", 5), row("A", "a7", 7), row("A", "a5y", 5)])
    recs = realdata.convert_problem_dumps([b, a], _encode)
    got = [(r.step, bytes(r.completion_ids).decode(), r.epoch, r.finish_reason) for r in recs]
    assert got == [(5, "a5x", 0.0, "stop"), (5, "a5y", 0.0, "stop"), (5, "b5", 0.0, "stop"), (7, "a7", 1.0, "stop"),
                   (9, "b9", 1.0, "stop")]
    line = realdata.to_jsonl(recs[:1]).decode()
    assert line.startswith('{"step":5,"epoch":0.0,"problem_key":') and line.endswith(',"finish_reason":"stop"}\n')


def _tiny_set(tmp_path: Path) -> tuple[realdata.RealSet, Path]:
    root = tmp_path / "sources"
    src = realdata.Source("someone/repo", "a" * 40, "dumps/p0.jsonl", None)
    path = _write(src.local(root), [{"input_token_ids": [3], "output_token_ids": [4, 5]}])
    src = replace(src, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    want = realdata.to_jsonl(realdata.convert_token_dumps([path]))
    return realdata.RealSet("tiny", "CC0", (src,), "token_dumps", hashlib.sha256(want).hexdigest(), 1), root


def test_build_offline_checks_every_pin(tmp_path):
    tiny, root = _tiny_set(tmp_path)
    out, log = tmp_path / "out", []
    assert realdata.build([tiny], out, root, offline=True, log=log.append) == [out / "tiny.jsonl"]
    assert [r.completion_ids for r in read_records(out / "tiny.jsonl")] == [[4, 5]]
    assert realdata.build([tiny], out, root, offline=True, log=log.append) and "already there" in log[-1]
    # a converted file that is not the pinned one is refused and left aside for a look
    wrong = replace(tiny, name="wrong", sha256="0" * 64)
    with pytest.raises(ValueError, match="converted file has sha256 .* pinned 0000"):
        realdata.build([wrong], out, root, offline=True, log=log.append)
    assert (out / "wrong.jsonl.mismatch").is_file() and not (out / "wrong.jsonl").exists()
    # a changed source, and a missing one offline
    path = tiny.sources[0].local(root)
    path.write_text(path.read_text().replace("4", "6"))
    with pytest.raises(ValueError, match="p0.jsonl: sha256 .* pinned"):
        realdata.build([replace(tiny, name="changed")], out, root, offline=True, log=log.append)
    path.unlink()
    with pytest.raises(FileNotFoundError, match="someone/repo@a{40}:dumps/p0.jsonl"):
        realdata.build([replace(tiny, name="gone")], out, root, offline=True, log=log.append)
    # a text set without a tokenizer, offline: says how to give one
    with pytest.raises(FileNotFoundError, match="--tokenizer FILE"):
        realdata.fetch_tokenizer(tmp_path / "no-tokenizer", offline=True)


def test_a_tokenizer_other_than_qwen25s_bpe_is_refused(tmp_path):
    spec = {"normalizer": {"type": "NFC"}, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": realdata.QWEN2_PATTERN}}, {"type": "ByteLevel"}]}}
    with pytest.raises(ValueError, match="not Qwen2.5's BPE: vocabulary [0-9a-f]{64} .*; merges") as err:
        realdata.check_qwen25_bpe(spec, "tok.json")
    assert "normalizer" not in str(err.value) and "pre-tokenizer" not in str(err.value)
    spec["normalizer"] = None
    with pytest.raises(ValueError, match="normalizer None"):
        realdata.check_qwen25_bpe(spec)
    (tmp_path / "t.json").write_text(json.dumps({"model": {"type": "WordPiece"}}))
    with pytest.raises(ValueError, match="not a byte-level BPE"):
        realdata.load_qwen25_encoder(tmp_path / "t.json")


def test_the_benchmarks_pages_list_every_source_and_pin():
    root = Path(__file__).resolve().parents[1]
    block = realdata.sources_block()
    for page in (root / "docs" / "benchmarks.md", root / "benchmarks" / "realdata.md"):
        text = page.read_text()
        assert block in text, f"{page.name}: run bash scripts/bench_page.sh --page-only"
    for real in realdata.SETS:
        assert real.sha256 in block and real.licence in block
        for src in real.sources:
            assert src.path in block and (src.sha256 is None or src.sha256 in block)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} absent (the third-party sets: "
                                                "python -m das_trl.bench.realdata builds them)")
def test_the_shared_copies_are_the_pinned_conversions():
    """The copies the committed suite ran on, against the pins: the R1 set byte for byte; the text sets' copies
    label problems with keys that are not problem_key(prompt_ids) (the rollout-log format's rule, which the
    converter follows), one key per prompt; with the keys set right (and the trainer's JSON style) they are the
    pinned files."""
    for real in realdata.SETS:
        path = SHARED / f"{real.name}.jsonl"
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != real.sha256:
            records = list(read_records(path))
            pairs = {(r.problem_key, problem_key(r.prompt_ids)) for r in records}
            assert len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs}), (
                f"{real.name}: the shared copy's keys are not one per prompt")
            for r in records:
                r.problem_key = problem_key(r.prompt_ids)
            data = realdata.to_jsonl(records)
        assert hashlib.sha256(data).hexdigest() == real.sha256, real.name
        assert data.count(b"\n") == real.rows

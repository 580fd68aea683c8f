"""Reliability cases 5 (bad input) and 7 (security), without vLLM: the real worker extension, proposer and drafter
behind fake workers (``reliability_fakes``). Every bad input must come back as ``{"ok": False, "error": ...}`` (or be
handled), leave the history unchanged, and leave the worker serving."""

from __future__ import annotations

import base64
import io
import json
import logging
import pickle
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from das_trl.vllm.payload import MAGIC, encode_history_state, encode_rollouts
from reliability_fakes import K, MAX_MODEL_LEN, VOCAB, FakeWorker

PROMPT = list(range(10, 30))
COMPLETION = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]


@pytest.fixture
def worker():
    w = FakeWorker()
    assert w.das_attach()["ok"]
    reply = w.das_add_history(encode_rollouts([PROMPT] * 2, [COMPLETION, COMPLETION[:6]]))
    assert reply["ok"], reply
    assert w.proposer.drafter.wait_for_updates(30)  # trees are built in the background
    return w


def _digest(w) -> str:
    return w.das_history_digest()["digest"]


def _still_drafts(w) -> list[int]:
    """One proposer round for a fresh request of the known problem: the history's continuation comes back."""
    runner = w.model_runner
    req = f"probe-{len(runner.requests)}"
    runner.set_rows([(req, PROMPT, COMPLETION[:3])])
    drafts = runner.step([[COMPLETION[2]]])
    runner.set_rows([])
    runner.step([])  # the request leaves the batch
    return drafts[0]


def _bad_payloads() -> dict[str, object]:
    good = encode_rollouts([PROMPT], [COMPLETION])
    blob = base64.b64decode(good)
    header = json.dumps({"prompt_lens": [2], "completion_lens": [-1], "problem_keys": None}).encode()
    negative_len = MAGIC + struct.pack("<I", len(header)) + header
    huge_header = MAGIC + struct.pack("<I", 2**31) + b"{}"
    return {
        "not base64": "this is not a payload!",
        "empty": "",
        "wrong magic": base64.b64encode(b"XXXX" + blob[4:]).decode(),
        "truncated": good[: len(good) // 2 // 4 * 4],
        "truncated header": base64.b64encode(huge_header).decode(),
        "header not json": base64.b64encode(MAGIC + struct.pack("<I", 3) + b"{x}").decode(),
        "negative length": base64.b64encode(negative_len).decode(),
        "extra bytes": base64.b64encode(blob + b"\0\0\0\0").decode(),
        "out of vocabulary": encode_rollouts([PROMPT], [[1, 2, VOCAB]]),
        "negative problem key": base64.b64encode(
            MAGIC + struct.pack("<I", 56) + json.dumps({"prompt_lens": [1], "completion_lens": [1],
                                                        "problem_keys": [-5]}).encode().ljust(56)
            + np.array([1, 2], "<i4").tobytes()).decode(),
        "not a string": 12345,
    }


@pytest.mark.parametrize("name", list(_bad_payloads()))
def test_bad_history_payload_is_rejected_and_changes_nothing(worker, name):
    before = _digest(worker)
    draft_before = _still_drafts(worker)
    reply = worker.das_add_history(_bad_payloads()[name])
    assert reply["ok"] is False and "rejected history payload" in reply["error"], reply
    assert _digest(worker) == before
    assert _still_drafts(worker) == draft_before != []


def test_oversized_payload_is_rejected_before_decoding(worker, monkeypatch):
    payload = encode_rollouts([PROMPT] * 50, [COMPLETION] * 50)
    reply = worker.das_add_history(payload, "100")
    assert not reply["ok"] and "exceeds the limit of 100 bytes" in reply["error"]
    monkeypatch.setenv("DAS_TRL_MAX_PAYLOAD_BYTES", "100")
    reply = worker.das_add_history(payload)
    assert not reply["ok"] and "exceeds the limit" in reply["error"]
    reply = worker.das_add_history(payload, "lots")  # a malformed limit is an error reply, not an exception
    assert not reply["ok"] and "decimal integer" in reply["error"]
    monkeypatch.delenv("DAS_TRL_MAX_PAYLOAD_BYTES")
    assert worker.das_add_history(payload)["ok"]


def test_empty_completions_are_ignored(worker):
    before = worker.das_stats()["stats"]
    reply = worker.das_add_history(encode_rollouts([PROMPT, [1, 2]], [[], []]))
    assert reply["ok"] and reply["added"]["sequences"] == 0 and reply["added"]["problems"] == 0
    reply = worker.das_add_history(encode_rollouts([], []))
    assert reply["ok"] and reply["added"]["sequences"] == 0
    assert worker.das_stats()["stats"]["history_tokens"] == before["history_tokens"]


def test_rpcs_before_attach_answer_and_propose_nothing():
    w = FakeWorker()  # the proposer exists, das_attach has not run
    stats = w.das_stats()["stats"]
    assert stats["attached"] is False
    # History pushed before attach is kept for when drafting starts.
    assert w.das_add_history(encode_rollouts([PROMPT], [COMPLETION]))["ok"]
    assert w.das_history_digest()["ok"]
    w.model_runner.set_rows([("r", PROMPT, COMPLETION[:3])])
    assert w.model_runner.step([[COMPLETION[2]]]) == [[]]
    assert w.das_stats()["stats"]["unattached_rounds"] == 1
    assert w.das_attach()["ok"]
    assert w.proposer.drafter.wait_for_updates(30)  # trees are built in the background
    assert w.model_runner.step([[COMPLETION[2]]])[0] != []


@pytest.mark.parametrize("method,args", [("das_attach", ()), ("das_stats", ()), ("das_detach", ()),
                                         ("das_reset", ()), ("das_history_digest", ()),
                                         ("das_add_history", ("x",)), ("das_load_history", ("x",))])
def test_rpcs_on_a_worker_without_das_or_before_its_runner_exists_are_error_replies(method, args):
    for w in (FakeWorker(das=False), FakeWorker(runner=False)):
        reply = getattr(w, method)(*args)
        assert reply["ok"] is False and "DAS drafter" in reply["error"], reply


def test_invalid_attach_config_and_reset_target_are_error_replies(worker):
    assert "invalid drafter config" in worker.das_attach("{not json")["error"]
    assert "invalid drafter config" in worker.das_attach('{"no_such_field": 1}')["error"]
    assert "invalid drafter config" in worker.das_attach('{"window": 0}')["error"]
    assert "exceeds the engine" in worker.das_attach(json.dumps({"max_spec_tokens": K + 1}))["error"]
    assert "unknown target" in worker.das_reset("everything")["error"]
    assert _still_drafts(worker)


def test_prompt_longer_than_tree_depth(worker):
    depth = worker.proposer.drafter.config.max_tree_depth
    long_prompt = list(np.arange(200, 200 + 3 * depth) % VOCAB)
    assert worker.das_add_history(encode_rollouts([long_prompt], [COMPLETION]))["ok"]
    runner = worker.model_runner
    runner.set_rows([("long", long_prompt, COMPLETION[:4])])
    draft = runner.step([[COMPLETION[3]]])[0]
    assert draft == COMPLETION[4 : 4 + len(draft)] and len(draft) > 0


def test_completion_at_max_model_len_gets_no_draft_past_it(worker):
    runner = worker.model_runner
    prompt = PROMPT
    # The context fills the model length but for one slot: no room for a draft token plus the bonus token.
    output = (COMPLETION * 40)[: MAX_MODEL_LEN - 1 - len(prompt)]
    runner.set_rows([("cut", prompt, output)])
    assert runner.step([[output[-1]]]) == [[]]
    # Two slots left: at most one draft token.
    runner.set_rows([("cut2", prompt, output[:-1])])
    assert len(runner.step([[output[-2]]])[0]) <= 1


def test_preempted_request_recomputed_from_a_shorter_state(worker):
    runner = worker.model_runner
    runner.set_rows([("p", PROMPT, COMPLETION[:8])])
    runner.step([[COMPLETION[7]]])
    # vLLM preempts the request and recomputes it: it comes back with less output known than before ...
    runner.set_rows([("p", PROMPT, COMPLETION[:3])])
    draft = runner.step([[COMPLETION[2]]])[0]
    assert draft and draft == COMPLETION[3 : 3 + len(draft)]
    # ... or leaves the batch for a few steps (prefill chunks: empty sampled lists) and returns.
    runner.set_rows([])
    runner.step([])
    runner.set_rows([("p", PROMPT, COMPLETION[:5])])
    assert runner.step([[]]) == [[]]
    assert runner.step([[COMPLETION[4]]])[0][:1] == [COMPLETION[5]]
    assert worker.das_stats()["stats"]["active_requests"] == 1


def test_unknown_problem_and_bad_explicit_problem_ids(worker, caplog):
    runner = worker.model_runner
    runner.set_rows([("u", [900, 901, 902], [903, 904])])
    assert isinstance(runner.step([[904]])[0], list)  # no history for it: fallbacks only, no error
    for bad in ("not-a-number", -3, None, 2**70):
        runner.set_rows([(f"x{bad}", [900, 901], [902])], extra_args={"das_problem_id": bad})
        with caplog.at_level(logging.WARNING):
            assert isinstance(runner.step([[902]])[0], list)
    # A well-formed explicit id of a problem never seen: handled like any unknown problem.
    runner.set_rows([("e", PROMPT, COMPLETION[:3])], extra_args={"das_problem_id": 12345})
    assert isinstance(runner.step([[COMPLETION[2]]])[0], list)


def test_concurrent_history_pushes_during_generation(worker):
    runner = worker.model_runner
    errors: list[BaseException] = []
    stop = threading.Event()

    def generate():
        try:
            step = 0
            while not stop.is_set():
                out = (COMPLETION * 20)[: 3 + step % 100]
                runner.set_rows([("g", PROMPT, out)])
                runner.step([[out[-1]]])
                step += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def push(i):
        for j in range(5):
            prompt = [i * 100 + j, 1, 2, 3]
            reply = worker.das_add_history(encode_rollouts([prompt] * 4, [COMPLETION] * 4))
            if not reply["ok"]:
                errors.append(AssertionError(reply))

    before = worker.das_stats()["stats"]["history_sequences"]
    gen = threading.Thread(target=generate)
    gen.start()
    pushers = [threading.Thread(target=push, args=(i,)) for i in range(4)]
    for t in pushers:
        t.start()
    for t in pushers:
        t.join()
    stop.set()
    gen.join()
    assert not errors, errors
    assert worker.das_stats()["stats"]["history_sequences"] == before + 4 * 5 * 4


# --------------------------------------------------------------------------------------------------- whole histories
def _state(w) -> dict:
    return w.proposer.drafter.state_dict()["history"]


_PICKLE_CALLS: list[str] = []


def _record_unpickling() -> list:
    _PICKLE_CALLS.append("unpickled")
    return []


class _Evil:
    def __reduce__(self):
        return (_record_unpickling, ())


def _npz(arrays: dict, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays) if not allow_pickle else _savez_pickled(buffer, arrays)
    return buffer.getvalue()


def _savez_pickled(buffer, arrays):
    import zipfile

    with zipfile.ZipFile(buffer, "w") as archive:
        for key, value in arrays.items():
            with archive.open(f"{key}.npy", "w") as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=True)


def test_bad_history_states_are_rejected_and_nothing_is_unpickled(worker):
    before = _digest(worker)
    state = _state(worker)
    inconsistent = dict(state, seq_lens=state["seq_lens"][:-1])
    evil = dict(state, tokens=np.array([_Evil()], dtype=object))
    b64 = lambda data: base64.b64encode(b"DASH" + data).decode()  # noqa: E731
    bad = {
        "inconsistent arrays": encode_history_state(inconsistent),
        "object array (pickle)": b64(_npz(evil, allow_pickle=True)),
        "plain pickle": base64.b64encode(pickle.dumps(_Evil())).decode(),
        "pickle behind the magic": b64(pickle.dumps(_Evil())),
        "missing member": b64(_npz({k: v for k, v in state.items() if k != "tails"})),
        "out of vocabulary": encode_history_state(dict(state, tokens=state["tokens"] + VOCAB)),
        "not base64": "%%%",
    }
    for name, payload in bad.items():
        reply = worker.das_load_history(payload)
        assert reply["ok"] is False and "rejected history state" in reply["error"], (name, reply)
        assert _digest(worker) == before, name
    assert _PICKLE_CALLS == []
    assert _still_drafts(worker)


def test_zip_bomb_history_state_is_rejected(worker):
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, value in _state(worker).items():
            data = io.BytesIO()
            np.lib.format.write_array(data, np.asarray(value))
            raw = data.getvalue() + (b"\0" * 50_000_000 if key == "tokens" else b"")
            archive.writestr(f"{key}.npy", raw)
    payload = base64.b64encode(b"DASH" + buffer.getvalue()).decode()
    assert len(payload) < 1_000_000
    reply = worker.das_load_history(payload, "1000000")
    assert reply["ok"] is False and "uncompressed bytes" in reply["error"]


# ---------------------------------------------------------------------------------------------------------- security
def test_serve_binds_loopback_by_default_and_warns_loudly_elsewhere(caplog):
    from das_trl.vllm.serve import build_parser, warn_if_exposed

    assert build_parser().parse_args([]).host == "127.0.0.1"
    with caplog.at_level(logging.WARNING, logger="das_trl.serve"):
        assert warn_if_exposed("127.0.0.1") is False and warn_if_exposed("localhost") is False
        assert not caplog.records
        assert warn_if_exposed("0.0.0.0") is True
    assert "!!!" in caplog.text and "0.0.0.0" in caplog.text and "/collective_rpc" in caplog.text
    assert build_parser().parse_args(["--max-payload-bytes", "1024"]).max_payload_bytes == 1024


def test_weight_reload_accepts_only_safetensors_directories(tmp_path):
    w = FakeWorker()
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(_Evil()))
    for path in (str(tmp_path), str(tmp_path / "missing"), "/etc/passwd"):
        reply = w.das_reload_weights(path)
        assert reply["ok"] is False and "safetensors" in reply["error"]
    assert _PICKLE_CALLS == []


def test_payload_code_never_unpickles_or_evaluates():
    root = Path(__file__).resolve().parents[1] / "das_trl" / "vllm"
    for name in ("payload.py", "worker_extension.py", "client.py"):
        source = (root / name).read_text()
        for needle in ("import pickle", "pickle.load", "eval(", "exec(", "allow_pickle=True", "torch.load"):
            assert needle not in source, (name, needle)
    assert "allow_pickle=False" in (root / "payload.py").read_text()

"""A real data-parallel DAS server: ``das-trl serve --data-parallel-size 2`` on vLLM's CPU build (two engine
processes behind one API server, vLLM's internal load balancer ``DPLBAsyncMPClient``).

vLLM's own ``/collective_rpc`` returns engine 0's replies only; das-trl's endpoint plugin (``POST
/das/collective_rpc``, loaded by ``das-trl serve``) returns every engine's. Checked here: a history push reaches both
engines (equal digests, equal to a mirror's), requests spread over both engines draft from it and have drafts
accepted, and a TRL training step (``DASGRPOTrainer``, server mode) runs against the server unchanged, its history
checked on both engines.
"""

from __future__ import annotations

import pytest
from server_utils import server_mode_trainer, start_das_server, stop

pytestmark = [pytest.mark.engine, pytest.mark.trainer]

K = 8  # as server_mode_trainer's


@pytest.fixture(scope="module")
def dp_server(model_path):
    base_url, process = start_das_server(model_path, K, extra=["--data-parallel-size", "2"])
    yield base_url
    stop(process)


def _per_engine(engine, method: str = "das_stats") -> dict[int, dict]:
    """``{engine rank: stats}`` from every engine of the server."""
    return {reply["engine"]: reply["stats"] for reply in engine.rpc(method) if reply.get("ok")}


def test_data_parallel_server_pushes_checks_and_drafts_on_every_engine(dp_server, model_path):
    from transformers import AutoTokenizer

    from das_trl.trainer.callback import DASHistoryMirror
    from das_trl.trainer.trl_client import DASVLLMClient
    from das_trl.vllm.client import DASEngineError, HTTPDASEngine, check_history_consistency

    engine = HTTPDASEngine(dp_server)
    assert engine.attach()["attached"] is True
    assert engine.layout["data_parallel_size"] == 2
    assert sorted(_per_engine(engine)) == [0, 1]
    # Through vLLM's own /collective_rpc only engine 0 answers (the dense model's engines each report
    # data_parallel_size 1; the server's config, /server_info, says 2): refused, with the fix.
    plain = HTTPDASEngine(dp_server)
    plain._all_engines_route = False
    with pytest.raises(DASEngineError, match="only 1 of its 2 engines answered.*das-trl serve --data-parallel-size 2"):
        plain.attach()
    engine.reset("all")

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"List the numbers from {a} to {a + 20}."}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)
               for a in (1, 30, 60, 90)]
    client = DASVLLMClient(base_url=dp_server, connection_timeout=10)
    first = client.generate(prompts, n=2, temperature=0.8, max_tokens=32, logprobs=0)
    rollout_prompts = [p for p in prompts for _ in range(2)]
    engine.add_history(rollout_prompts, first["completion_ids"])
    mirror = DASHistoryMirror(16, 8_000_000)
    mirror.record(rollout_prompts, first["completion_ids"])
    digests = engine.labelled_history_digests()
    assert sorted(digests) == ["engine 0 worker 0", "engine 1 worker 0"]
    assert set(digests.values()) == {mirror.digest()}, digests
    assert check_history_consistency([engine], expected=mirror.digest()).consistent

    # Greedy requests for the same prompts, four copies each: the load balancer spreads them over both engines.
    engine.reset("counters")
    client.generate(prompts * 4, n=1, temperature=0.0, max_tokens=32, logprobs=0)
    stats = _per_engine(engine)
    for rank, engine_stats in stats.items():
        assert engine_stats["request_rounds"] > 0, (rank, stats)
        assert engine_stats["accepted_tokens"] > 0, (rank, stats)


def test_trl_training_step_against_a_data_parallel_server(dp_server, tmp_path, model_path):
    from das_trl.vllm.client import HTTPDASEngine

    engine = HTTPDASEngine(dp_server)
    engine.reset("all")
    trainer = server_mode_trainer(dp_server, tmp_path, model_path, max_steps=1)
    assert trainer.vllm_generation.engine.layout["data_parallel_size"] == 2
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "das/rollout_seconds" in h]
    assert log.get("das/history_repairs", 0.0) == 0.0 and "das/history_push_failures" not in log, log
    # The step's 8 rollouts reached both engines, exactly once, as the trainer's mirror holds them; the weights the
    # step trained were reloaded into both engines (the CPU build's weight path, das_reload_weights).
    assert engine.history_digests() == [trainer._das_mirror.digest()] * 2
    assert [s["history_sequences"] for s in _per_engine(engine).values()] == [8, 8]

"""DAS with TRL's experimental asynchronous trainer (``trl.experimental.async_grpo``): ``DASAsyncGRPOTrainer`` against
a real ``das-trl serve``, the rollout worker's history sync, and what lets the trainer run on a CPU-only torch."""

from __future__ import annotations

import pytest

ROLLOUT_LEN = 32


def _sample(prompt: list[int], completion: list[int], group: int) -> dict:
    import numpy as np

    return {"input_ids": np.asarray(prompt + completion), "completion_mask": np.asarray([0] * len(prompt) +
                                                                                        [1] * len(completion)),
            "old_log_probs": np.zeros(len(prompt) + len(completion), np.float32), "advantage": 1.0, "group_id": group}


def test_cpu_tree_attention_scores_like_separate_forwards(model_path):
    """A packed prefix trie (two samples sharing a prompt, one alone) scored through TRL's fused head with the torch
    tree attention gives each trained token the log-probability a plain forward of its own sample gives."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.experimental.async_grpo.packing import TreeRow
    from trl.trainer.utils import add_fused_lm_head

    from das_trl.trainer.async_grpo.cpu import TREE_ATTENTION, register_cpu_tree_attention

    register_cpu_tree_attention()
    prompt, other = list(range(100, 120)), list(range(300, 311))
    samples = [_sample(prompt, [5, 6, 7, 8, 9], 0), _sample(prompt, [5, 6, 40, 41], 0), _sample(other, [7, 8, 9], 1)]
    row = TreeRow()
    for sample in samples:
        row.add(sample)
    packed = row.pack()
    assert packed["input_ids"].numel() < sum(len(s["input_ids"]) for s in samples)  # the shared prompt counts once
    tree = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation=TREE_ATTENTION, dtype=torch.float32)
    add_fused_lm_head(tree)
    kwargs = {key: packed[key] for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")}
    kwargs["tree_max_seqlen_q"], kwargs["tree_max_seqlen_k"] = packed["tree_max_seqlens"].tolist()
    with torch.no_grad():
        out = tree(input_ids=packed["input_ids"][None], position_ids=packed["position_ids"][None],
                   shift_labels=packed["shift_labels"][None], fused_lm_head=True, **kwargs)
    got = out.log_probs.flatten()[packed["token_index"]]

    tree.set_attn_implementation("sdpa")  # the same weights, plain causal attention, one sample at a time
    expected = []
    with torch.no_grad():
        for sample in samples:
            ids = torch.as_tensor(sample["input_ids"])
            logp = torch.log_softmax(tree(input_ids=ids[None]).logits[0].float(), dim=-1)
            expected += [logp[p - 1, ids[p]] for p in range(1, len(ids)) if sample["completion_mask"][p]]
    assert len(got) == len(expected) == 12
    torch.testing.assert_close(got, torch.stack(expected), atol=2e-4, rtol=0)


def test_config_refuses_colocate_weight_sync(tmp_path):
    from das_trl.trainer.async_grpo import DASAsyncGRPOConfig

    with pytest.raises(ValueError, match="'inplace' needs a colocated engine"):
        DASAsyncGRPOConfig(output_dir=str(tmp_path), das_weight_sync="inplace", bf16=False, report_to="none")
    with pytest.raises(ValueError, match="das_window"):
        DASAsyncGRPOConfig(output_dir=str(tmp_path), das_window=0, bf16=False, report_to="none")


def test_response_parsing_for_chatml_and_refusal_otherwise(model_path):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import parse_response

    from das_trl.trainer.async_grpo.response_parsing import ensure_response_parsing

    tokenizer = AutoTokenizer.from_pretrained(model_path)  # SmolLM2: ChatML, not on TRL's list
    assert ensure_response_parsing(tokenizer) == "chatml"
    assert ensure_response_parsing(tokenizer) == "present"
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True,
                                           return_dict=False)
    ids = tokenizer("It is 4.<|im_end|>")["input_ids"]
    assert parse_response(tokenizer, ids, prefix=prefix) == {"role": "assistant", "content": "It is 4."}
    other = AutoTokenizer.from_pretrained(model_path)
    other.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="response_template"):
        ensure_response_parsing(other)


@pytest.fixture(scope="module")
def das_server(model_path):
    from server_utils import start_das_server, stop

    base_url, process = start_das_server(model_path)
    yield base_url
    stop(process)


@pytest.mark.engine
def test_history_sync_keys_restores_and_repairs(das_server, tmp_path):
    """The worker's history sync: explicit das_problem_id keys, a mirror restored from a checkpoint folder loaded into
    an engine that holds something else, and the digest check after each push."""
    from trl.experimental.async_grpo.async_rollout_worker import TrainingSequence

    from das_trl.drafter import problem_key
    from das_trl.trainer.async_grpo.history import RolloutHistorySync
    from das_trl.trainer.problem_ids import problem_id_key
    from das_trl.vllm.client import HTTPDASEngine

    engine = HTTPDASEngine(das_server)
    engine.reset("history")

    def group(prompt: list[int], completions: list[list[int]]) -> list[list[TrainingSequence]]:
        return [[TrainingSequence(prompt + c, [0] * len(prompt) + [1] * len(c), [0.0] * (len(prompt) + len(c)), "r")]
                for c in completions]

    sync = RolloutHistorySync(engine, window=4, token_budget=100_000, history_dir=str(tmp_path / "a"))
    assert sync.push()["das/history_reloads"] == 1.0  # start: the engine gets this run's (empty) history
    sync.record_group(group([1, 2, 3], [[4, 5, 6], [4, 5, 7]]), {"das_problem_id": ["p1", "p1"]})
    sync.record_group(group([9, 9], [[8, 8, 8]]), {})
    metrics = sync.push()
    assert metrics["das/history_repairs"] == 0.0 and metrics["das/history_rollouts"] == 3.0
    assert sorted(sync.mirror.history.problems()) == sorted([problem_id_key("p1"), problem_key([9, 9])])
    assert engine.history_digests() == [sync.mirror.digest()]

    engine.reset("history")  # a restarted server: the resumed run's first push loads the checkpoint's mirror
    resumed = RolloutHistorySync(engine, window=4, token_budget=100_000, restore_dir=str(tmp_path / "a"))
    assert resumed.mirror.digest() == sync.mirror.digest()
    resumed.push()
    assert engine.history_digests() == [sync.mirror.digest()]
    engine.add_history([[1, 1]], [[2, 2, 2]])  # the engine drifts from the mirror: the next push repairs it
    resumed.record_group(group([9, 9], [[8, 1]]), {})
    assert resumed.push()["das/history_repairs"] == 1.0
    assert engine.history_digests() == [resumed.mirror.digest()]


@pytest.mark.engine
@pytest.mark.trainer
def test_async_trainer_three_steps_push_history_and_draft(das_server, tmp_path, model_path):
    """Three asynchronous steps: weights reloaded on CPU at every sync, the rollout worker's rollouts pushed into the
    server's history at each model-version change (the engine's digest equals the worker's mirror), drafts accepted,
    das/* metrics in the trainer's logs."""
    from das_trl.defaults.data import load_reasoning_gym_dataset
    from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
    from das_trl.trainer.async_grpo import DASAsyncGRPOConfig, DASAsyncGRPOTrainer, DASRolloutWorker
    from das_trl.trainer.async_grpo.weight_transfer import ReloadWeightTransfer
    from das_trl.trainer.callback import DASHistoryMirror
    from das_trl.vllm.client import HTTPDASEngine

    engine = HTTPDASEngine(das_server)
    engine.reset("all")
    args = DASAsyncGRPOConfig(
        output_dir=str(tmp_path / "run"), vllm_server_base_url=das_server, num_generations=4,
        per_device_train_batch_size=4, max_completion_length=ROLLOUT_LEN, temperature=0.8, learning_rate=1e-5,
        max_steps=3, logging_steps=1, save_strategy="no", report_to="none", seed=0, bf16=False,
        gradient_checkpointing=False, token_budget=0, max_inflight_tasks=4, queue_maxsize=8,
        das_num_speculative_tokens=8,
    )
    trainer = DASAsyncGRPOTrainer(model=model_path, reward_funcs=DEFAULT_REWARD_FUNCS, args=args,
                                  train_dataset=load_reasoning_gym_dataset("gsm_symbolic", size=2, seed=0))
    assert isinstance(trainer.rollout_worker, DASRolloutWorker)
    assert isinstance(trainer.weight_transfer, ReloadWeightTransfer)  # CPU build: no NCCL
    trainer.train()

    assert trainer.state.global_step == 3 and trainer.model_version == 4  # the cold sync, then one per step
    stats = engine.stats()
    assert stats["accepted_tokens"] > 0 and stats["history_problems"] == 2, stats
    mirror = DASHistoryMirror(args.das_window, args.das_history_token_budget)
    assert mirror.load(trainer.das_history_dir)
    assert engine.history_digests() == [mirror.digest()]  # the engine holds exactly what the worker pushed
    pushes = [h for h in trainer.state.log_history if "das/history_repairs" in h]
    assert pushes and all(h["das/history_repairs"] == 0.0 for h in pushes)
    assert sum(h["das/accepted_tokens"] for h in pushes) > 0
    assert all(h["das/model_version"] >= 2 for h in pushes)  # pushed at version changes, not at the cold sync
    assert trainer.weight_transfer.seconds > 0

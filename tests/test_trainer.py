"""Real GRPO steps with DASGRPOTrainer through a real CPU vLLM engine running DAS (colocate mode).

The run's second step must draft from the first step's history, policy weights must reach the engine after each
optimizer step (engine logprobs change and match the updated HF model), and das/* metrics must be logged.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.trainer

# Engine (vLLM, float32, KV cache) vs HF (float32, eager) logprobs of the same tokens: kernels differ in accumulation
# order only; measured max |diff| is ~3e-5 nats, the bound leaves room for other CPUs.
WEIGHT_LOGPROB_TOLERANCE = 1e-3
# Sampled tokens' logprobs, engine (processed logprobs, T=0.8) vs trainer, as TRL logs them: float32 level.
SAMPLING_LOGP_MEAN_TOLERANCE = 1e-3
SAMPLING_LOGP_MAX_TOLERANCE = 1e-2


def _config(tmp_path, **overrides):
    from das_trl.trainer import DASGRPOConfig

    base = dict(
        output_dir=str(tmp_path / "run"),
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=768,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=48,
        temperature=0.8,
        learning_rate=1e-5,
        beta=0.0,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        bf16=False,
        das_num_speculative_tokens=8,
        # No dtype: the engine follows the trainer's compute dtype (float32 here; vLLM's 'auto' would give bf16).
        das_vllm_kwargs={"kv_cache_memory_bytes": 512 * 1024**2, "enforce_eager": True},
    )
    base.update(overrides)
    return DASGRPOConfig(**base)


def _dataset():
    from das_trl.defaults.data import load_reasoning_gym_dataset

    # Two problems, two per step: both steps see the same problems (RL epochs), so step 2 can draft from step 1.
    return load_reasoning_gym_dataset("gsm_symbolic", size=2, seed=0)


def _engine_logprobs(llm, prompt_ids, completion_ids):
    """Engine logprobs of a fixed completion, scored as prompt tokens (teacher forcing)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": prompt_ids + completion_ids}], params, use_tqdm=False)[0]
    tail = out.prompt_logprobs[len(prompt_ids):]
    return [entry[token].logprob for entry, token in zip(tail, completion_ids)]


def _hf_logprobs(model, prompt_ids, completion_ids):
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


def test_two_grpo_steps_draft_from_history_and_sync_weights(tmp_path, model_path):
    from transformers import AutoTokenizer

    from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
    from das_trl.trainer import DASGRPOTrainer

    trainer = DASGRPOTrainer(
        model=model_path,
        reward_funcs=DEFAULT_REWARD_FUNCS,
        args=_config(tmp_path, learning_rate=2e-4),
        train_dataset=_dataset(),
    )
    llm = trainer.vllm_generation.llm
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False)
    completion_ids = tokenizer("2 + 3 = 5, so the answer is <answer>5</answer>.")["input_ids"]
    before = _engine_logprobs(llm, prompt_ids, completion_ids)

    trainer.train()

    logs = [h for h in trainer.state.log_history if "das/rollout_seconds" in h]
    assert len(logs) == 2, trainer.state.log_history
    # Step 1 starts with an empty history; its rollouts are pushed at its end, and step 2 drafts from them.
    assert logs[0]["das/history_problems"] == 2
    assert logs[1]["das/draft_tokens"] > 0
    assert logs[1]["das/accepted_tokens"] > 0
    # The budget controller's diagnostics reach the logs by prefix: what it kept is what the proposer proposed.
    assert logs[1]["das/budget/steps"] > 0, logs[1]
    assert logs[1]["das/budget/kept_tokens"] == logs[1]["das/draft_tokens"], logs[1]
    assert logs[1]["das/budget/offered_tokens"] >= logs[1]["das/budget/kept_tokens"], logs[1]
    stats = trainer.vllm_generation.das_stats()
    assert stats["history_sequences"] == 16  # 2 steps x 2 problems x 4 samples
    # The default configuration samples at float32 level: TRL's |trainer - engine| logprob difference of the sampled
    # tokens (with vLLM's default bf16 it was mean 2.5e-2, max 0.3-0.55; float32 engines: ~1e-5 / ~2e-3).
    assert stats["engine_dtype"] == "float32"
    for log in logs:
        assert log["sampling/sampling_logp_difference/mean"] < SAMPLING_LOGP_MEAN_TOLERANCE, log
        assert log["sampling/sampling_logp_difference/max"] < SAMPLING_LOGP_MAX_TOLERANCE, log
    assert stats.get("source_problem", 0) > 0, stats  # drafts won by per-problem history trees

    # The engine now holds the step-2 weights: logprobs moved, and agree with the updated HF model.
    trainer.vllm_generation.sync_weights()
    after = _engine_logprobs(llm, prompt_ids, completion_ids)
    hf_after = _hf_logprobs(trainer.model.eval(), prompt_ids, completion_ids)
    assert max(abs(a - b) for a, b in zip(after, before)) > 10 * WEIGHT_LOGPROB_TOLERANCE
    assert max(abs(a - b) for a, b in zip(after, hf_after)) < WEIGHT_LOGPROB_TOLERANCE


def test_plain_grpo_config_gets_das_defaults(tmp_path):
    from trl import GRPOConfig

    from das_trl.drafter import DrafterConfig
    from das_trl.trainer.config import DASGRPOConfig, das_settings, drafter_config_fields

    settings = das_settings(GRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False))
    assert settings["enabled"] is True and settings["num_speculative_tokens"] == 64 and settings["window"] == 16
    # The trainer's drafter is the replay suite's default one (das+controller): same K and drafter settings.
    for args in (GRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False),
                 DASGRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False)):
        fields = drafter_config_fields(das_settings(args))
        fields.pop("budget_controller")
        ours = DrafterConfig(**fields).to_dict()
        default = DrafterConfig().to_dict()
        assert {k: ours[k] for k in default if k not in ("builder_threads", "draft_threads")} == \
            {k: v for k, v in default.items() if k not in ("builder_threads", "draft_threads")}


def test_server_down_is_a_clear_error_at_start(tmp_path, model_path):
    from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
    from das_trl.trainer import DASGRPOTrainer
    from das_trl.vllm.client import DASEngineError

    args = _config(tmp_path, vllm_mode="server", vllm_server_base_url="http://127.0.0.1:9", vllm_server_timeout=1)
    with pytest.raises(DASEngineError, match="cannot be reached"):
        DASGRPOTrainer(model=model_path, reward_funcs=DEFAULT_REWARD_FUNCS, args=args, train_dataset=_dataset())

"""GRPO with a LoRA adapter and DAS (colocate mode, real CPU engine): the step drafts, and what reaches the engine is
the *merged* model (base + adapter), as TRL does, while the trainer's model stays unmerged for training."""

from __future__ import annotations

import pytest

# Helpers of the full-model trainer test: the same config, data set and logprob comparison (engine vs HF).
from test_trainer import WEIGHT_LOGPROB_TOLERANCE, _config, _dataset, _engine_logprobs, _hf_logprobs

pytestmark = pytest.mark.trainer


def test_lora_grpo_step_drafts_and_engine_serves_merged_weights(tmp_path, model_path):
    import torch
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
    from das_trl.trainer import DASGRPOTrainer

    trainer = DASGRPOTrainer(
        model=model_path,
        reward_funcs=DEFAULT_REWARD_FUNCS,
        args=_config(tmp_path, max_steps=1, max_completion_length=32),
        train_dataset=_dataset(),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    model = trainer.model
    assert hasattr(model, "merge_adapter"), type(model)  # a PEFT model: only the adapter trains
    trainer.train()
    logs = [h for h in trainer.state.log_history if "das/rollout_seconds" in h]
    assert len(logs) == 1 and logs[0]["das/history_problems"] == 2, trainer.state.log_history
    assert trainer.vllm_generation.das_stats()["request_rounds"] > 0

    # Make the adapter large enough that merged and base weights differ clearly (lora_B starts at zero).
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False)
    completion_ids = tokenizer("2 + 3 = 5, so the answer is <answer>5</answer>.")["input_ids"]
    llm = trainer.vllm_generation.llm
    before = _engine_logprobs(llm, prompt_ids, completion_ids)

    trainer.vllm_generation.sync_weights()

    after = _engine_logprobs(llm, prompt_ids, completion_ids)
    model.eval()
    assert not any(getattr(m, "merged", False) for m in model.modules())  # sync left the adapter unmerged
    with model.disable_adapter():
        base = _hf_logprobs(model, prompt_ids, completion_ids)
    model.merge_adapter()
    try:
        merged = _hf_logprobs(model, prompt_ids, completion_ids)
    finally:
        model.unmerge_adapter()
    assert max(abs(m - b) for m, b in zip(merged, base)) > 10 * WEIGHT_LOGPROB_TOLERANCE  # the adapter matters
    assert max(abs(a - b) for a, b in zip(after, before)) > 10 * WEIGHT_LOGPROB_TOLERANCE  # the engine changed
    assert max(abs(a - m) for a, m in zip(after, merged)) < WEIGHT_LOGPROB_TOLERANCE  # to the merged model


def test_enable_lora_in_engine_kwargs_is_refused_with_an_explanation(tmp_path, model_path):
    from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
    from das_trl.trainer import DASGRPOTrainer

    args = _config(tmp_path, das_vllm_kwargs={"enable_lora": True, "enforce_eager": True})
    with pytest.raises(ValueError, match="merges a PEFT/LoRA adapter"):
        DASGRPOTrainer(model=model_path, reward_funcs=DEFAULT_REWARD_FUNCS, args=args, train_dataset=_dataset())

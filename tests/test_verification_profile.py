"""Every step within what the engine profiled (``das_trl.vllm.verification_profile``).

* The limits: ``D`` = the rows vLLM's profile ran (one draft each), the longest draft ``D // N`` on the padded shape,
  none on the CPU build, ``DAS_TRL_VERIFY_DRAFT_TOKENS`` over all of it; the proposer reports them and reads the
  scheduler's token budget (``max_num_scheduled_tokens``) for its step cap.
* The step cap enforces them on a replay whose drafts would exceed them, without changing a token.
* The profile hook: vLLM's own ``GPUModelRunner._dummy_sampler_run`` (called with a stand-in runner on CPU tensors)
  runs the rejection sampler once more, with logprobs, at ``N`` rows and ``D`` draft tokens; not on an engine
  without the DAS proposer.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from das_trl.vllm import verification_profile as vp


def _config(max_num_seqs=32, max_num_batched_tokens=4096, max_num_scheduled_tokens=None, k=8):
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                         max_num_scheduled_tokens=max_num_scheduled_tokens),
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=1024, get_vocab_size=lambda: 1000))


def test_limits_follow_the_profiled_shape():
    patched = vp.verification_limits(_config(k=2), "patched", cpu=False, environ={})
    assert patched == vp.VerificationLimits(32, 32, None, "profile")  # N = 32 rows > 8 full drafts of K = 2
    assert vp.verification_limits(_config(k=2), "padded", cpu=False, environ={}).longest_draft == 1
    # room for FULL_DRAFTS_PROFILED rows drafting the full K: a small engine's tail rows keep their long drafts
    small = vp.verification_limits(_config(max_num_seqs=8, k=64), "patched", cpu=False, environ={})
    assert small == vp.VerificationLimits(8, vp.FULL_DRAFTS_PROFILED * 64, None, "profile")
    assert vp.verification_limits(_config(max_num_seqs=8, k=64), "padded", cpu=False, environ={}).longest_draft == 64
    # the profile samples min(max_num_seqs, max_num_batched_tokens) rows; D never exceeds the step's token budget
    assert vp.verification_limits(_config(max_num_batched_tokens=20), "patched", cpu=False, environ={}).draft_tokens == 20
    cpu = vp.verification_limits(_config(), "patched", cpu=True, environ={})
    assert cpu.draft_tokens is None and cpu.longest_draft is None and cpu.source.startswith("none")
    env = {vp.ENV_VAR: "100"}
    assert vp.verification_limits(_config(), "padded", cpu=True, environ=env) == vp.VerificationLimits(
        32, 100, 3, vp.ENV_VAR)
    with pytest.raises(ValueError, match=vp.ENV_VAR):
        vp.verification_limits(_config(), "patched", cpu=False, environ={vp.ENV_VAR: "many"})
    with pytest.raises(ValueError, match="shape"):
        vp.verification_limits(_config(), "square", cpu=False, environ={})
    assert vp.verification_limits(SimpleNamespace(scheduler_config=None), "patched", cpu=False, environ={}) is None
    assert vp.spread_drafts(7, 3) == [3, 2, 2]


def test_proposer_reports_the_limits_and_reads_the_scheduler_budget(monkeypatch):
    from das_trl.vllm.proposer import DASProposer, scheduler_token_budget

    assert scheduler_token_budget(_config(max_num_scheduled_tokens=3000)) == 3000
    assert scheduler_token_budget(_config()) == 4096
    monkeypatch.setenv(vp.ENV_VAR, "48")
    proposer = DASProposer(_config(max_num_scheduled_tokens=3000))
    stats = proposer.stats()
    assert stats["max_num_scheduled_tokens"] == 3000 == proposer.speculator.max_step_tokens
    assert stats["verify_draft_limit"] == 48 == proposer.speculator.max_step_drafts
    assert stats["verify_profiled_rows"] == 32 and stats["verify_limit_source"] == vp.ENV_VAR
    assert stats["verification_shape"] in ("patched", "padded")
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert getattr(GPUModelRunner._dummy_sampler_run, "__das_verification_profile__", False)
    # a replaced drafter keeps the limits
    proposer.drafter = proposer.drafter
    assert proposer.speculator.max_step_drafts == 48 and proposer.speculator.max_step_tokens == 3000
    # the trainer logs them with its das/* metrics
    from das_trl.trainer.history_sync import verification_metrics

    metrics = verification_metrics(stats)
    assert metrics["das/verify_draft_limit"] == 48.0 and metrics["das/peak_step_drafts"] == 0.0
    assert metrics["das/verification_patched"] == float(stats["verification_shape"] == "patched")
    assert "das/verify_draft_len_limit" not in metrics or stats["verification_shape"] == "padded"


def _converged_replay(speculator_limits):
    """A replay of converged histories (long drafts) with these Speculator limits: (tokens per batch, the
    Speculator's counters over the whole replay)."""
    from das_trl.bench import drafters, sets, simulation

    from test_long_drafts import _converged

    drafter = drafters.make_drafter("das+controller")
    for name, value in speculator_limits.items():
        setattr(drafter.speculator, name, value)
    train, evals, _, _ = sets.split_epochs(_converged(), None, None)
    return simulation.simulate(drafter, train, evals, 7.0, 0.025).tokens, drafter.speculator.counters


def test_step_cap_keeps_drafts_within_the_limits():
    tokens, free = _converged_replay({})
    assert free["peak_step_drafts"] > 24 and free["peak_draft_len"] > 6  # the caps below bind
    capped_tokens, capped = _converged_replay({"max_step_drafts": 24})
    assert 0 < capped["peak_step_drafts"] <= 24 and capped["capped_steps"] > 0
    padded_tokens, padded = _converged_replay({"max_draft_len": 6})
    assert 0 < padded["peak_draft_len"] <= 6 and padded["capped_steps"] > 0
    assert capped_tokens == padded_tokens == tokens  # the replay's outputs never change


def test_bad_limits_are_refused():
    from das_trl.budget import BudgetController
    from das_trl.drafter import DrafterConfig, create_drafter
    from das_trl.vllm.speculator import Speculator

    for name in ("max_step_drafts", "max_draft_len"):
        with pytest.raises(ValueError, match=name):
            Speculator(create_drafter(DrafterConfig()), BudgetController(), 100, **{name: -1})


# ----------------------------------------------------------------------------------------------- the profile hook


class _Runner:
    """What vLLM's ``GPUModelRunner._dummy_sampler_run`` reads from its runner, on CPU tensors."""

    def __init__(self, drafter, vocab=300):
        from vllm.v1.sample.rejection_sampler import RejectionSampler
        from vllm.v1.sample.sampler import Sampler

        head = torch.randn(16, vocab)
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(multimodal_config=None))
        self.model = SimpleNamespace(compute_logits=lambda hidden: hidden @ head)
        self.device = torch.device("cpu")
        self.sampler = Sampler(logprobs_mode="processed_logprobs")
        self.speculative_config = SimpleNamespace(rejection_sample_method="standard", draft_sample_method="greedy")
        self.rejection_sampler = RejectionSampler(self.sampler)
        self.drafter = drafter


@pytest.fixture
def hooked_runner_class(monkeypatch):
    """A class whose ``_dummy_sampler_run`` is vLLM's own function, hooked; rejection-sampler calls recorded."""
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    load_general_plugins()  # the CPU sampling fix: vLLM's Triton expansion cannot run here
    current_platform.register_triton_kernel_overrides()  # the CPU kernels a CPU worker registers
    calls = []
    upstream = RejectionSampler.forward

    def recording(self, metadata, draft_probs, logits, sampling_metadata):
        calls.append((list(metadata.num_draft_tokens), logits.shape[0], sampling_metadata.max_num_logprobs))
        return upstream(self, metadata, draft_probs, logits, sampling_metadata)

    monkeypatch.setattr(RejectionSampler, "forward", recording)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: None)  # vLLM syncs its GPU; none here
    # vLLM's own function (unwrapped, should an earlier test have built a proposer that hooked GPUModelRunner)
    runner_cls = type("Runner", (_Runner,), {"_dummy_sampler_run": getattr(
        GPUModelRunner._dummy_sampler_run, "__wrapped__", GPUModelRunner._dummy_sampler_run)})
    assert vp.install_profile_hook(runner_cls) and vp.install_profile_hook(runner_cls)  # idempotent
    yield runner_cls, calls


def test_profile_hook_runs_verification_with_logprobs_at_the_largest_step(hooked_runner_class):
    runner_cls, calls = hooked_runner_class
    limits = vp.VerificationLimits(profiled_rows=6, draft_tokens=14, longest_draft=None, source="profile")
    runner = runner_cls(SimpleNamespace(verification_limits=limits))
    with torch.compiler.set_stance("force_eager"):
        runner._dummy_sampler_run(torch.randn(6, 16))
    # vLLM's two calls (one draft per row, no logprobs: mixed sampling, then all-greedy), then the hook's
    assert calls[:2] == [([1] * 6, 12, None)] * 2
    assert calls[2:] == [([3, 3, 2, 2, 2, 2], 6 + 14, vp.PROFILE_NUM_LOGPROBS)]
    assert "forward" not in vars(runner.rejection_sampler)  # vLLM's module is left as it was


def test_profile_hook_leaves_other_engines_alone(hooked_runner_class):
    runner_cls, calls = hooked_runner_class
    for drafter in (None, SimpleNamespace(verification_limits=vp.VerificationLimits(6, None, None, "none"))):
        calls.clear()
        with torch.compiler.set_stance("force_eager"):
            runner_cls(drafter)._dummy_sampler_run(torch.randn(6, 16))
        assert [c[2] for c in calls] == [None, None]


@pytest.mark.parametrize("shape", ["patched", "padded"])
def test_proposer_prices_its_engines_verification_shape(monkeypatch, shape):
    """The budget controller prices the logprob path the engine runs: the engine's shape, and the assumed cost per
    row scaled to the model's vocabulary unless the user gave one (the vocabulary here: 1,000 entries)."""
    from das_trl.budget import ControllerConfig
    from das_trl.budget.cost_model import ASSUMED_C_LOGPROB_MS, ASSUMED_LOGPROB_VOCAB
    from das_trl.vllm import proposer as proposer_module

    monkeypatch.setattr(proposer_module, "verification_shape", lambda: shape)
    proposer = proposer_module.DASProposer(_config())
    cfg = proposer.controller.config
    assert cfg.verification_shape == shape and proposer.controller.cost.padded == (shape == "padded")
    assert cfg.c_logprob_ms == pytest.approx(ASSUMED_C_LOGPROB_MS * 1000 / ASSUMED_LOGPROB_VOCAB)
    runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[]))
    proposer.attach(runner, controller_config=ControllerConfig(c_logprob_ms=0.004, verification_shape="patched"))
    cfg = proposer.controller.config
    assert cfg.verification_shape == shape and cfg.c_logprob_ms == 0.004  # the user's figure, the engine's shape
    assert proposer.stats()["budget_c_logprob_ms"] == 0.004

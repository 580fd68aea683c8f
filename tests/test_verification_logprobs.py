"""Verification logprobs at the verified positions only (``das_trl.vllm.verification_logprobs``).

* After vLLM loads its general plugins, ``RejectionSampler._get_logprobs_tensors`` is das-trl's, and on hand-built
  verification steps (mixed draft lengths, rows without drafts, rejected and placeholder positions, logprobs 0 and 5,
  the logits modes) it gives vLLM's own values at every position that can be accepted, and the same lists through
  ``parse_output``.
* Its memory is in proportion to the positions verified: one long draft costs what the same draft tokens spread one
  per row cost (vLLM's own function: 20x more at this scaled-down vocabulary; the full-size figures come from
  ``scripts/bench_verification_logprobs.py``).
* On a vLLM whose functions it does not know, or whose behaviour fails the self-check, it is not installed, says so
  once, and reports the padded shape.

Compiled vLLM helpers run eagerly here (``force_eager``): compiling them takes ~40 s on a CI core.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
import torch

from das_trl.vllm import verification_logprobs as vl

ROOT = Path(__file__).resolve().parents[1]

DRAFTS = [[5, 7, 9], [], [2], [4] * 12, [], [1, 3]]
# per row: the sampled tokens (-1: rejected or past the draft), as the rejection sampler writes them
SAMPLED = [[5, 7, 8, -1], [6, -1, -1, -1], [2, 11], [4] * 12 + [13], [0], [1, -1, -1]]
VOCAB = 512


def _bench():
    spec = importlib.util.spec_from_file_location("bench_verification_logprobs",
                                                  ROOT / "scripts" / "bench_verification_logprobs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def eager():
    with torch.compiler.set_stance("force_eager"):
        yield


@pytest.fixture
def unpatched():
    """vLLM's own function for the test's duration (the patch, if the plugin installed it, comes back after)."""
    was = vl.is_installed()
    vl.uninstall_patch()
    yield
    vl.uninstall_patch()
    if was:
        assert vl.install_patch()


def _step(drafts, sampled, vocab=VOCAB, seed=0):
    width = max(len(d) for d in drafts) + 1
    tokens = torch.full((len(drafts), width), -1, dtype=torch.int32)
    for i, row in enumerate(sampled):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    metadata = vl.make_metadata(drafts)
    logits = torch.randn(sum(len(d) + 1 for d in drafts), vocab, generator=torch.Generator().manual_seed(seed))
    return metadata, logits, tokens


def _sampler(mode="processed_logprobs"):
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    return RejectionSampler(Sampler(logprobs_mode=mode))


def _call(fn, sampler, num_logprobs, metadata, logits, tokens):
    target = logits[metadata.target_logits_indices.long()]
    bonus = logits[metadata.bonus_logits_indices.long()]
    return fn(sampler, num_logprobs, metadata, logits, target, bonus, tokens)


def test_installed_by_vllms_general_plugins():
    from vllm.plugins import load_general_plugins
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    load_general_plugins()
    assert RejectionSampler._get_logprobs_tensors is vl.logprobs_at_verified_positions
    assert vl.verification_shape() == "patched" and vl.patch_state() == "patched"


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits"])
@pytest.mark.parametrize("num_logprobs", [0, 5])
def test_same_values_as_vllm_at_every_position_that_can_be_accepted(unpatched, mode, num_logprobs):
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    sampler = _sampler(mode)
    metadata, logits, tokens = _step(DRAFTS, SAMPLED)
    want = _call(RejectionSampler._get_logprobs_tensors, sampler, num_logprobs, metadata, logits, tokens)
    got = _call(vl.logprobs_at_verified_positions, sampler, num_logprobs, metadata, logits, tokens)
    width = tokens.shape[1]
    assert got.logprobs.shape == want.logprobs.shape == (len(DRAFTS) * width, num_logprobs + 1)
    can_accept = torch.tensor([j <= len(d) for d in DRAFTS for j in range(width)])
    for a, b in zip(got[:3], want[:3]):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a[can_accept], b[can_accept])
    # the placeholders of rejected positions inside a draft are scored as upstream scores them (token 0)
    assert int(got.logprob_token_ids[3, 0]) == 0  # row 0, position 3
    # what vLLM's model runner hands on: identical lists
    lists = [RejectionSampler.parse_output(tokens, VOCAB, logprobs_tensors=t) for t in (got, want)]
    assert lists[0][0] == lists[1][0]
    for field in ("logprob_token_ids", "logprobs", "sampled_token_ranks"):
        assert (getattr(lists[0][1], field) == getattr(lists[1][1], field)).all(), field
    assert lists[0][1].cu_num_generated_tokens == lists[1][1].cu_num_generated_tokens


def test_an_all_draftless_step_and_one_row():
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    sampler = _sampler()
    for drafts, sampled in (([[], [], []], [[3], [4], [5]]), ([[8, 9]], [[8, 1]])):
        metadata, logits, tokens = _step(drafts, sampled)
        want = _call(vl._upstream(), sampler, 0, metadata, logits, tokens)
        got = _call(vl.logprobs_at_verified_positions, sampler, 0, metadata, logits, tokens)
        for a, b in zip(RejectionSampler.parse_output(tokens, VOCAB, logprobs_tensors=got),
                        RejectionSampler.parse_output(tokens, VOCAB, logprobs_tensors=want)):
            assert a == b if isinstance(a, list) else (a.logprobs == b.logprobs).all()


def test_verified_position_rows():
    cu = torch.tensor([4, 5, 7], dtype=torch.int32)  # drafts of 3, 0, 1
    assert vl.verified_position_rows(cu, 7, 4).tolist() == [0, 1, 2, 3, 4, 8, 9]


def test_memory_in_proportion_to_the_positions_verified(unpatched):
    """B 64, 64 draft tokens, vocabulary 16,384 (the benchmark's target, scaled down): one long draft holds at most
    2x the tensors of the same tokens spread one per row, + 64 MiB scaled by the vocabulary; vLLM's function does
    not (so the measure can fail)."""
    bench = _bench()
    vocab = 16_384
    slack = bench.SLACK_BYTES * vocab // 151_936
    sampler = bench.rejection_sampler()
    peaks = {}
    for label, fn in (("upstream", vl._upstream()), ("patched", vl.logprobs_at_verified_positions)):
        for name in ("spread", "one long"):
            inputs = bench.verification_inputs(bench.layout(name, 64, 64), vocab)
            existing = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
            existing += [v for v in vars(inputs["metadata"]).values() if isinstance(v, torch.Tensor)]
            with bench.TensorPeak(*existing) as peak:
                out = fn(sampler, 0, **inputs)
            del out
            peaks[label, name] = peak.peak
    assert peaks["patched", "one long"] <= 2 * peaks["patched", "spread"] + slack, peaks
    assert peaks["upstream", "one long"] > 10 * (2 * peaks["upstream", "spread"] + slack), peaks
    # two float32 [positions, vocab] tensors plus the rank comparison: about 9 bytes per position and token
    assert peaks["patched", "one long"] < 12 * 128 * vocab


def test_tensor_peak_counts_live_storage_only():
    bench = _bench()
    x = torch.ones(1000)
    with bench.TensorPeak(x) as peak:
        y = x * 2  # 4,000 bytes
        z = y.view(10, 100) + 1  # another 4,000; the view shares y's
        del y
        w = torch.zeros(250)  # 1,000, while y is gone
    assert peak.peak == 8000 and peak.current == 5000
    del z, w


def test_unknown_release_is_left_alone_and_said_once(unpatched, monkeypatch, caplog):
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    def _get_logprobs_tensors(self, *args):  # a release das-trl has not read
        return None

    monkeypatch.setattr(RejectionSampler, "_get_logprobs_tensors", _get_logprobs_tensors)
    with caplog.at_level(logging.WARNING, logger="vllm.das_trl.verification_logprobs"):
        assert vl.install_patch() is False
        assert vl.install_patch() is False
    assert RejectionSampler._get_logprobs_tensors is _get_logprobs_tensors
    assert vl.verification_shape() == "padded" and vl.patch_state().startswith("unknown vLLM release")
    assert len([r for r in caplog.records if "unknown vLLM release" in r.message]) == 1
    # a function Python has no source for (a build without .py files) is not a known release either
    exec("def _get_logprobs_tensors(self, *args): return None", namespace := {})
    monkeypatch.setattr(RejectionSampler, "_get_logprobs_tensors", namespace["_get_logprobs_tensors"])
    vl.uninstall_patch()
    assert vl.install_patch() is False and vl.patch_state().startswith("unknown vLLM release")


def test_a_known_source_that_behaves_otherwise_fails_the_self_check(unpatched, monkeypatch):
    """A release whose source hashes as known but whose layout differs (here: logprobs of the padded rows shifted by
    one position) is refused by the functional check."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    upstream = RejectionSampler._get_logprobs_tensors

    def shifted(self, n, metadata, logits, target, bonus, tokens):
        out = upstream(self, n, metadata, logits, target, bonus, tokens)
        return out._replace(logprobs=out.logprobs.roll(1, 0))

    monkeypatch.setattr(RejectionSampler, "_get_logprobs_tensors", shifted)
    monkeypatch.setattr(vl, "KNOWN_RELEASES", {vl.upstream_digests(): "a test release"})
    assert vl.install_patch() is False
    assert vl.patch_state() == "self-check failed on a test release"
    assert RejectionSampler._get_logprobs_tensors is shifted
    assert vl.functional_check(reference=upstream)  # the real function passes the same check


def test_disabled_by_environment(unpatched, monkeypatch):
    monkeypatch.setenv(vl.ENV_VAR, "0")
    assert vl.install_patch() is False
    assert vl.verification_shape() == "padded" and "disabled" in vl.patch_state()

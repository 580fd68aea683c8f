"""``recipes/gpu/verification_cost.py`` at toy size on the CPU (the full grid is for a GPU).

* Its two paths compute what they stand for: at every verified position the padded path (vLLM's layout) and the
  patched path give the same logprobs, token ids and ranks, and they equal das-trl's patch run through vLLM's own
  ``RejectionSampler`` (so the timed work is the engine's).
* Its JSON: the schema, one point per (dtype, B, longest, shape), padded rows >= patched rows (equal only when no
  row is longer than the others), points over the memory limit skipped, a fit over the measured points.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _recipe():
    spec = importlib.util.spec_from_file_location("verification_cost",
                                                  ROOT / "recipes" / "gpu" / "verification_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verified(drafts, width):
    return torch.tensor([j <= d for d in drafts for j in range(width)])


@pytest.mark.parametrize("num_logprobs", [0, 3])
def test_paths_agree_at_verified_positions(num_logprobs):
    vc = _recipe()
    drafts = vc.step_layout(batch=5, longest=6, short=2)
    inputs = vc.step_inputs(drafts, vocab=64, dtype=torch.bfloat16, device="cpu", seed=3)
    padded = vc.padded_logprobs(inputs, num_logprobs)
    patched = vc.patched_logprobs(inputs, num_logprobs)
    keep = _verified(drafts, max(drafts) + 1)
    assert padded[0].shape == patched[0].shape == (5 * 7, num_logprobs + 1)
    for a, b in zip(padded, patched):
        assert torch.equal(a[keep], b[keep])
    assert not torch.equal(padded[1], patched[1])  # the padding differs: the check can fail


def test_patched_path_is_das_trls_patch():
    """The recipe's patched path = ``logprobs_at_verified_positions`` on vLLM's RejectionSampler."""
    from das_trl.vllm import verification_logprobs as vl
    from vllm.v1.sample.sampler import Sampler
    from types import SimpleNamespace

    vc = _recipe()
    drafts = vc.step_layout(batch=4, longest=5, short=1)
    inputs = vc.step_inputs(drafts, vocab=48, dtype=torch.float32, device="cpu", seed=1)
    token_drafts = [[1] * d for d in drafts]
    metadata = vl.make_metadata(token_drafts)
    owner = SimpleNamespace(sampler=Sampler, is_logits_logprobs_mode=False)
    with torch.compiler.set_stance("force_eager"):
        want = vl.logprobs_at_verified_positions(owner, 2, metadata, inputs["logits"], inputs["target_logits"],
                                                 inputs["bonus_logits"], inputs["sampled_token_ids"])
    got = vc.patched_logprobs(inputs, 2)
    keep = _verified(drafts, max(drafts) + 1)
    assert torch.equal(got[0][keep], want.logprob_token_ids[keep])
    assert torch.allclose(got[1][keep], want.logprobs[keep])
    assert torch.equal(got[2][keep], want.selected_token_ranks[keep])


def test_toy_run_json(tmp_path, capsys):
    vc = _recipe()
    out = tmp_path / "cost.json"
    assert vc.main(["--batch", "2,6", "--longest", "1,3", "--short", "1", "--vocab", "96", "--repeats", "2",
                    "--warmup", "1", "--dtype", "bfloat16,float32", "--device", "cpu", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == vc.SCHEMA and data["vocab"] == 96 and data["num_logprobs"] == 0
    assert set(data["cost_model"]) == {"c_logprob_ms", "vocab"}
    assert set(data["fit"]) == {"points", "a_ms", "c_logprob_ms", "c_logprob_ms_per_1k_vocab", "r2"}
    points = data["points"]
    assert len(points) == 2 * 2 * 2 * 2
    by_key = {}
    for p in points:
        assert p["ms"] is not None and p["ms"] > 0 and p["peak_mib"] is None  # CPU: no CUDA allocator peak
        by_key.setdefault((p["dtype"], p["batch"], p["longest"]), {})[p["shape"]] = p
    for (_, batch, longest), shapes in by_key.items():
        patched, padded = shapes["patched"], shapes["padded"]
        assert patched["rows"] == patched["positions"] == longest + 1 + (batch - 1) * (min(1, longest) + 1)
        assert padded["rows"] == batch * (longest + 1) >= patched["rows"]
        assert (padded["rows"] > patched["rows"]) == (longest > 1 and batch > 1)
    assert data["fit"]["points"] == 8  # the first dtype's points
    assert "fit (bfloat16" in capsys.readouterr().out


def test_points_over_the_memory_limit_are_skipped(tmp_path):
    vc = _recipe()
    out = tmp_path / "cost.json"
    # vocab 4096, drafts [16] + 7 x [2]: the patched point's estimate is ~4.5 MiB (38 positions), the padded
    # one's ~11.3 MiB (136 rows); limit 8 MiB
    vc.main(["--batch", "8", "--longest", "16", "--vocab", "4096", "--repeats", "1", "--warmup", "0",
             "--dtype", "float32", "--device", "cpu", "--max-gib", str(8 / 1024), "--json", str(out)])
    points = {p["shape"]: p for p in json.loads(out.read_text())["points"]}
    assert points["padded"]["ms"] is None and "GiB" in points["padded"]["skipped"]
    assert points["patched"]["ms"] is not None


def test_a_point_out_of_memory_is_recorded_and_the_grid_goes_on(tmp_path, monkeypatch):
    """The estimate can fall short (an H200 ran out at B 1024, longest 64, padded, eager): that point is listed as
    out of memory and the later points are still measured."""
    vc = _recipe()
    real = vc.time_call
    calls = []

    def time_call(fn, repeats, warmup, cuda):
        calls.append(1)
        if len(calls) == 2:  # the first point's padded shape
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(fn, repeats, warmup, cuda)

    monkeypatch.setattr(vc, "time_call", time_call)
    out = tmp_path / "cost.json"
    vc.main(["--batch", "4", "--longest", "1,4", "--vocab", "256", "--repeats", "1", "--warmup", "0",
             "--dtype", "float32", "--device", "cpu", "--json", str(out)])
    points = json.loads(out.read_text())["points"]
    assert [p["ms"] is None for p in points] == [False, True, False, False]
    assert points[1]["skipped"].startswith("out of memory")


def test_bad_arguments_are_refused():
    vc = _recipe()
    with pytest.raises(SystemExit):
        vc.parse_args(["--batch", "0,4"])
    with pytest.raises(SystemExit):
        vc.parse_args(["--dtype", "bfloat17"])

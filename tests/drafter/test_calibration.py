"""Acceptance calibration: the calibrator's arithmetic and the drafter learning from verification reports."""

import numpy as np
import pytest

from drafter_utils import make_drafter
from das_trl.drafter.reference.calibration import AcceptanceCalibrator
from das_trl.drafter.sources import SOURCE_ORDER, match_bucket


def test_empty_calibrator_keeps_the_prior_and_makes_it_non_increasing():
    cal = AcceptanceCalibrator(SOURCE_ORDER)
    assert cal.ratio("problem", 3, 0.5) == 1.0
    assert cal.calibrate("problem", 3, [0.9, 0.5, 0.6, 0.2]) == [0.9, 0.5, 0.5, 0.2]


def test_rejections_lower_and_acceptances_raise_the_estimate_per_cell():
    cal = AcceptanceCalibrator(SOURCE_ORDER, pseudocount=4.0)
    for _ in range(50):
        cal.observe("global", 2, [0.5, 0.5], num_accepted=0)  # predicted 1.0 token, got 0
        cal.observe("local", 2, [0.5, 0.5], num_accepted=2)  # predicted 1.0, got 2
    assert cal.ratio("global", 2, 0.5) == pytest.approx(4 / 54)
    assert cal.calibrate("global", 2, [0.5])[0] == pytest.approx(0.5 * 4 / 54)
    assert cal.ratio("local", 2, 0.5) == pytest.approx(104 / 54)
    assert cal.calibrate("local", 2, [0.55, 0.51]) == [1.0, pytest.approx(0.51 * 104 / 54)]  # capped at 1
    # Other cells are untouched: another source, another match-length bucket, another prior bin.
    assert cal.ratio("problem", 2, 0.5) == 1.0
    assert cal.ratio("global", 9, 0.5) == 1.0
    assert cal.ratio("global", 2, 0.95) == 1.0
    assert cal.observed_tokens == 200


def test_accepted_prefix_labels_and_clipping():
    cal = AcceptanceCalibrator(["s"], bins=1, pseudocount=1.0)
    cal.observe("s", 1, [0.8, 0.6, 0.4], num_accepted=2)
    assert cal.hits.sum() == 2 and cal.expected.sum() == pytest.approx(1.8)
    cal.observe("s", 1, [0.8], num_accepted=7)  # clipped to the draft length
    assert cal.hits.sum() == 3


def test_counts_decay_past_the_cap_so_the_ratio_follows_drift():
    cal = AcceptanceCalibrator(["s"], bins=1, pseudocount=1.0, cap=100.0)
    for _ in range(1000):
        cal.observe("s", 1, [0.5], num_accepted=0)
    assert cal.expected.max() <= 100.0
    for _ in range(300):  # the policy now agrees with the history: the ratio recovers
        cal.observe("s", 1, [0.5], num_accepted=1)
    assert cal.ratio("s", 1, 0.5) > 1.5


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        AcceptanceCalibrator(["s"], bins=0)
    with pytest.raises(ValueError):
        AcceptanceCalibrator(["s"], pseudocount=0.0)
    with pytest.raises(KeyError):
        AcceptanceCalibrator(["s"]).ratio("nope", 1, 0.5)
    assert [match_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 100)] == [0, 1, 2, 2, 3, 3, 4, 4]


def _drafter_with_history(**kw):
    d = make_drafter(use_global_tree=False, use_local_tree=False, share_running_siblings=False,
                     share_running_batch=False, **kw)
    prompt = list(range(100, 140))
    completion = list(range(1000, 1040))
    d.add_rollouts([prompt] * 8, [completion] * 8)
    return d, prompt, completion


@pytest.mark.parametrize("calibrate", [True, False])
def test_drafter_learns_from_rejected_drafts(calibrate):
    """Every draft of the problem tree is rejected at its first token: with calibration the drafter stops drafting
    from it (fewer wasted verification tokens); without, it keeps drafting the same tokens."""
    d, prompt, completion = _drafter_with_history(calibrate_acceptance=calibrate)
    first = None
    for i in range(40):
        rid = f"r{i}"
        d.start_request(rid, prompt)
        d.extend_request(rid, completion[:10])
        draft = d.propose(rid, np.array(prompt + completion[:10]), 8)
        first = draft if first is None else first
        d.record_acceptance(rid, 0)
        d.stop_request(rid)
    assert first == completion[10:18]
    s = d.stats()
    assert s["verified_drafts"] == (s["drafts"]) and s["accepted_tokens"] == 0
    if calibrate:
        assert len(draft) < len(first)
        assert min(min(row) for row in d.calibration()["problem"]) < 0.5
    else:
        assert draft == first and d.calibration() == {}


def test_record_acceptance_without_a_draft_is_ignored():
    d, prompt, completion = _drafter_with_history()
    d.start_request("a", prompt)
    d.record_acceptance("a", 3)  # nothing proposed yet
    d.record_acceptance("unknown", 3)
    assert d.propose("a", np.array(prompt), 4)
    d.record_acceptance("a", 4)
    d.record_acceptance("a", 4)  # reported twice: the second is ignored
    s = d.stats()
    assert s["verified_drafts"] == 1 and s["accepted_tokens"] == 4


def test_new_step_decays_counts_towards_the_prior():
    cal = AcceptanceCalibrator(["s"], bins=1, pseudocount=1.0, step_decay=0.5)
    for _ in range(40):
        cal.observe("s", 1, [0.5], num_accepted=0)
    low = cal.ratio("s", 1, 0.5)
    cal.new_step()
    assert cal.expected.sum() == pytest.approx(10.0) and cal.ratio("s", 1, 0.5) > low
    with pytest.raises(ValueError):
        AcceptanceCalibrator(["s"], step_decay=1.5)


def test_a_source_shut_off_by_rejections_is_tried_again_after_a_few_steps():
    """Rejections push the problem tree's estimate under the threshold, so it stops drafting and gets no new
    observations; the per-push decay brings it back, and then it learns that its drafts are accepted again."""
    d, prompt, completion = _drafter_with_history(min_token_prob=0.2)

    def one_request(i, accept):
        rid = f"r{i}"
        d.start_request(rid, prompt)
        d.extend_request(rid, completion[:10])
        draft = d.propose(rid, np.array(prompt + completion[:10]), 8)
        d.record_acceptance(rid, len(draft) if accept else 0)
        d.stop_request(rid)
        return draft

    for i in range(60):
        one_request(i, accept=False)
    assert one_request(100, accept=True) == []  # shut off
    other_prompt, other_completion = list(range(5000, 5040)), list(range(6000, 6040))
    for step in range(6):  # training steps of another problem: this problem's tree and evidence stay as they were
        d.add_rollouts([other_prompt] * 8, [other_completion] * 8)
    drafts = [one_request(200 + i, accept=True) for i in range(20)]
    assert drafts[0], "the decayed cell must be drafted from again"
    assert len(drafts[-1]) >= len(drafts[0])


def test_trimmed_draft_tokens_teach_nothing():
    d, prompt, completion = _drafter_with_history()
    d.start_request("a", prompt)
    assert len(d.propose("a", np.array(prompt), 8)) == 8
    d.record_acceptance("a", 0, num_verified=3)  # vLLM verified only 3 of the 8 tokens
    assert d.stats()["calibration_tokens"] == 3

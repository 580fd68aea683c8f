"""Acceptance calibration: the calibrator's arithmetic and the drafter learning from verification reports."""

import numpy as np
import pytest

from drafter_utils import make_drafter
from das_trl.drafter import SOURCE_ORDER
from das_trl.drafter.calibration import AcceptanceCalibrator, match_bucket


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

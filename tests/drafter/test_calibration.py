"""Acceptance calibration: the calibrator's arithmetic and the drafter learning from verification reports."""

import numpy as np
import pytest

from drafter_utils import make_drafter
from das_trl.drafter.reference.calibration import AcceptanceCalibrator
from das_trl.drafter.sources import SOURCE_ORDER, match_bucket, position_bucket


def test_empty_calibrator_keeps_the_prior_as_products_of_conditionals():
    cal = AcceptanceCalibrator(SOURCE_ORDER)
    assert cal.ratio("problem", 3, 0, 0.5) == 1.0
    # conditionals 0.9, 0.5/0.9, 0.6/0.5 -> capped at 1, 0.2/0.6: the running products never rise
    out = cal.calibrate("problem", 3, [0.9, 0.5, 0.6, 0.2])
    assert out == [0.9, pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.5 * 0.2 / 0.6)]


def test_rejections_lower_and_acceptances_raise_the_estimate_per_cell():
    cal = AcceptanceCalibrator(SOURCE_ORDER, pseudocount=4.0)
    for _ in range(50):
        cal.observe("global", 2, [0.5, 0.25], num_accepted=0)  # the first token rejected: the second never tried
        cal.observe("local", 2, [0.5, 0.25], num_accepted=2)   # both accepted (conditionals 0.5, 0.5)
    # the cell and its (source, position) parent both hold 0 hits / 25 expected; the cell shrinks to the parent
    parent = 4 / 29
    assert cal.ratio("global", 2, 0, 0.5) == pytest.approx((0 + 4 * parent) / 29)
    assert cal.ratio("global", 2, 1, 0.5) == pytest.approx(parent)  # never tried: position 1's pooled ratio
    assert cal.calibrate("global", 2, [0.5])[0] == pytest.approx(0.5 * (4 * parent) / 29)
    up = 54 / 29
    assert cal.ratio("local", 2, 0, 0.5) == pytest.approx((50 + 4 * up) / 29)
    up1 = (50 + 4 * up) / 29  # position 2's parent, shrunk towards position 1's
    assert cal.ratio("local", 2, 1, 0.5) == pytest.approx((50 + 4 * up1) / 29)
    assert cal.calibrate("local", 2, [0.55, 0.3]) == [1.0, 1.0]  # capped at 1
    # Other cells: another source is untouched; another match bucket or bin of the same position takes the parent.
    assert cal.ratio("problem", 2, 0, 0.5) == 1.0
    assert cal.ratio("global", 9, 0, 0.5) == pytest.approx(4 * parent / 4)
    assert cal.ratio("global", 2, 0, 0.95) == pytest.approx(parent)
    assert cal.observed_tokens == 200


def test_far_positions_learn_their_own_decay():
    """A tree path that says "certain" all along (conditionals 1.0), of which verification accepts the first 4 of
    every 12 tokens: positions 1-4 learn acceptance, positions 5-8 rejection (only position 5 is ever tried), and
    positions 9+, never tried, take the decay of the position bucket before them."""
    cal = AcceptanceCalibrator(["s"], pseudocount=1.0)
    for _ in range(200):
        cal.observe("s", 5, [0.9] * 12, num_accepted=4)
    est = cal.calibrate("s", 5, [0.9] * 12)
    assert est[3] > 0.95 and est[4] < 0.01
    assert cal.ratio("s", 5, 4, 1.0) < 0.01 and cal.ratio("s", 5, 8, 1.0) < 0.01
    fresh = AcceptanceCalibrator(["s"], pseudocount=1.0)
    assert fresh.ratio("s", 5, 40, 1.0) == 1.0  # nothing observed anywhere: the prior


def test_accepted_prefix_labels_and_clipping():
    cal = AcceptanceCalibrator(["s"], bins=1, pseudocount=1.0)
    cal.observe("s", 1, [0.8, 0.6, 0.4], num_accepted=1)  # token 0 accepted, token 1 rejected, token 2 not tried
    assert cal.hits.sum() == 1 and cal.expected.sum() == pytest.approx(0.8 + 0.6 / 0.8)
    cal.observe("s", 1, [0.8], num_accepted=7)  # clipped to the draft length
    assert cal.hits.sum() == 2
    assert cal.observed_tokens == 4  # verified tokens, tried or not


def test_counts_decay_past_the_cap_so_the_ratio_follows_drift():
    cal = AcceptanceCalibrator(["s"], bins=1, pseudocount=1.0, cap=100.0)
    for _ in range(1000):
        cal.observe("s", 1, [0.5], num_accepted=0)
    assert cal.expected.max() <= 100.0
    for _ in range(300):  # the policy now agrees with the history: the ratio recovers
        cal.observe("s", 1, [0.5], num_accepted=1)
    assert cal.ratio("s", 1, 0, 0.5) > 1.5


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        AcceptanceCalibrator(["s"], bins=0)
    with pytest.raises(ValueError):
        AcceptanceCalibrator(["s"], pseudocount=0.0)
    with pytest.raises(KeyError):
        AcceptanceCalibrator(["s"]).ratio("nope", 1, 0, 0.5)
    assert [match_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 100)] == [0, 1, 2, 2, 3, 3, 4, 4]
    assert [position_bucket(i) for i in (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63)] == [0, 1, 2, 2, 3, 3, 4, 4, 5, 5,
                                                                                     6, 6]


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
        assert min(min(min(bins) for bins in row) for row in d.calibration()["problem"]) < 0.5
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
    low = cal.ratio("s", 1, 0, 0.5)
    cal.new_step()
    assert cal.expected.sum() == pytest.approx(10.0) and cal.ratio("s", 1, 0, 0.5) > low
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

"""The native core drafts exactly what the Python reference drafter drafts (with the reference suffix tree, whose
ties go to the smallest token as the native core's do): tokens, sources, match lengths and the calibrated
acceptance estimates, bit for bit, across pushes, evictions, recency weights, zero and partial budgets, trims and
partial verifications, live-pool evictions. The reference ingests every row before it drafts: the native core is
compared with ``defer_idle_rows`` off (with it, drafting steps see the idle rows' newest tokens a step later;
tests/drafter/test_background_ingest.py)."""

import numpy as np
import pytest

from das_trl.drafter import DrafterConfig
from das_trl.drafter.reference import DASDrafter
from das_trl.drafter.reference.reference_tree import ReferenceSuffixTree
from native_sim import simulate_pair


def pair(**kw):
    from das_trl.drafter import NativeDASDrafter

    kw.setdefault("draft_threads", 1)
    kw.setdefault("defer_idle_rows", False)
    cfg = DrafterConfig(support_table_bits=22, **kw)  # wide count-min table: no collisions at this size
    return NativeDASDrafter(cfg), DASDrafter(cfg, tree_factory=ReferenceSuffixTree)


CASES = [  # DrafterConfig fields, plus simulation sizes (vocab, out_len, n_problems, samples, steps)
    dict(),
    dict(vocab=8),  # heavy repetition: many equal counts (ties), long chains
    dict(vocab=200, out_len=100),
    dict(calibrate_acceptance=False),
    dict(max_spec_factor=2.0, min_token_prob=0.1, max_spec_offset=1.0),
    dict(recent_appearance_weight=2, window=2, history_token_budget=400),  # evictions by window and budget
    dict(truncate_by_evidence=False, global_samples_per_appearance=0),
    dict(use_local_tree=False, share_running_batch=False, prompt_tail_tokens=4),
    dict(max_tree_depth=12, match_context_tokens=8, support_ngram=4),
    dict(draft_threads=3, n_problems=6, samples=8, steps=2),  # rows drafted by three threads
    dict(live_token_budget=300),  # finished outputs evicted (down to half the budget) while siblings still run
]


@pytest.mark.parametrize("case", [dict(c) for c in CASES], ids=[",".join(f"{k}={v}" for k, v in c.items()) or "defaults" for c in CASES])
@pytest.mark.parametrize("use_step", [True, False], ids=["step", "propose_batch"])
def test_native_equals_reference(case, use_step):
    sim = {k: case.pop(k) for k in ("vocab", "out_len", "n_problems", "samples", "steps") if k in case}
    nat, ref = pair(**case)
    bad, rows = simulate_pair(nat, ref, seed=len(str(case)), use_step=use_step, **sim)
    assert rows > 300
    assert bad == 0, f"{bad} of {rows} rows differ"
    assert nat.check() == ""
    sn, sr = nat.stats(), ref.stats()
    for key in ("proposals", "drafts", "draft_tokens", "requests", "wins", "verified_drafts", "accepted_tokens",
                "calibration_tokens", "tokens", "appearances", "sequences", "lingering_finished",
                "live_running_tokens", "live_finished_tokens", "live_evicted_outputs", "live_evicted_tokens",
                "live_tree_tokens"):
        assert sn[key] == sr[key], key
    if "live_token_budget" in case:
        assert sn["live_evicted_outputs"] > 0


def test_equivalence_check_can_fail():
    """The comparison notices a real difference: a different evidence pseudocount changes drafts."""
    from das_trl.drafter import NativeDASDrafter

    nat = NativeDASDrafter(DrafterConfig(support_table_bits=22, evidence_pseudocount=50.0))
    ref = DASDrafter(DrafterConfig(support_table_bits=22), tree_factory=ReferenceSuffixTree)
    bad, rows = simulate_pair(nat, ref, seed=3)
    assert bad > 0


def test_reference_tree_agrees_with_arctic_up_to_ties(rng):
    """ReferenceSuffixTree is arctic's SuffixTree except for the tie rule: wherever the drafts differ, arctic's token
    is an equally frequent continuation at the first differing position."""
    from das_trl.drafter.reference.arctic import suffix_tree

    SuffixTree = suffix_tree()
    a, r = SuffixTree(16), ReferenceSuffixTree(16)
    seqs = [rng.integers(0, 12, int(rng.integers(20, 80))).astype(np.int32) for _ in range(12)]
    for i, s in enumerate(seqs):
        a.extend_ndarray(i, s.copy())
        r.extend(i, s.tolist())
    a.remove(3)
    r.remove(3)
    same = 0
    for _ in range(300):
        ctx = rng.integers(0, 12, 16).tolist()
        da = a.speculate(ctx, 8, 1.0, 0.0, 0.05, False)
        dr = r.speculate(ctx, 8, 1.0, 0.0, 0.05, False)
        if list(da.token_ids) == dr.token_ids:
            assert list(da.probs) == dr.probs and da.match_len == dr.match_len
            same += 1
            continue
        # First difference: both continuations must have the same count after the shared prefix.
        k = next(i for i, (x, y) in enumerate(zip(list(da.token_ids), dr.token_ids)) if x != y) \
            if min(len(da.token_ids), len(dr.token_ids)) else 0
        node = r._match(ctx[len(ctx) - da.match_len:] + dr.token_ids[:k]) if da.match_len == dr.match_len else None
        assert node is not None, "drafts differ beyond a tie (different match length)"
        ca, cr = node.children[list(da.token_ids)[k]].count, node.children[dr.token_ids[k]].count
        assert ca == cr and dr.token_ids[k] < list(da.token_ids)[k]
    assert same > 150

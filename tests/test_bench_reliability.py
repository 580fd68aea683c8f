"""The replay's reliability record: predicted vs realised acceptance per draft position bucket and source, from a
hand-built accept/reject record."""

import numpy as np
import pytest

from das_trl.bench.reliability import (POSITION_BUCKETS, ReliabilityRecord, bucket_of, format_reliability,
                                       worst_gap, write_reliability_plot)
from das_trl.drafter.sources import SOURCE_ORDER

PROBLEM, GLOBAL = SOURCE_ORDER.index("problem"), SOURCE_ORDER.index("global")


def test_buckets_are_the_issue_s_position_ranges():
    assert POSITION_BUCKETS == ((1, 4), (5, 16), (17, 32), (33, 64))
    assert [bucket_of(p) for p in (1, 4, 5, 16, 17, 32, 33, 64, 100)] == [0, 0, 1, 1, 2, 2, 3, 3, 3]
    with pytest.raises(ValueError):
        bucket_of(0)


def test_hand_built_record_gives_the_bucket_means():
    rec = ReliabilityRecord()
    # a 20-token problem draft, 6 accepted: positions 1-4 all accepted, 5-6 accepted, 7-16 not, 17-20 not
    rec.add(PROBLEM, [0.9] * 4 + [0.5] * 12 + [0.25] * 4, [1.0] * 20, 6)
    # a 3-token global draft, none accepted
    rec.add(GLOBAL, [0.2, 0.1, 0.05], [0.3, 0.2, 0.1], 0)
    b = rec.buckets()
    assert [x["tokens"] for x in b] == [7, 12, 4, 0]
    assert b[0]["predicted"] == pytest.approx((0.9 * 4 + 0.35) / 7)
    assert b[0]["realised"] == pytest.approx(4 / 7)
    assert b[0]["drafter"] == pytest.approx((4 + 0.6) / 7)
    assert b[1]["predicted"] == pytest.approx(0.5) and b[1]["realised"] == pytest.approx(2 / 12)
    assert b[1]["gap"] == pytest.approx(0.5 - 2 / 12)
    assert b[2]["realised"] == 0.0 and b[3]["predicted"] is None and b[3]["realised"] is None
    by_source = rec.to_dict()["by_source"]
    assert set(by_source) == {"problem", "global"}
    assert by_source["global"][0] == {"positions": "1-4", "tokens": 3, "predicted": pytest.approx(0.35 / 3),
                                      "drafter": pytest.approx(0.2), "realised": 0.0,
                                      "gap": pytest.approx(0.35 / 3)}
    per = rec.to_dict()["per_position"]
    assert per["tokens"][:4] == [2, 2, 2, 1] and per["realised"][5] == 1.0 and per["realised"][6] == 0.0
    assert per["predicted"][63] is None
    # the worst gap counts only buckets with enough tokens
    assert worst_gap(rec.to_dict(), min_tokens=10) == pytest.approx(0.5 - 2 / 12)
    assert worst_gap(rec.to_dict(), min_tokens=100) is None


def test_sent_then_verified_counts_only_the_verified_tokens():
    rec = ReliabilityRecord()
    rec.sent("a", PROBLEM, np.array([0.8, 0.6, 0.4]), np.array([0.9, 0.7, 0.5]))
    rec.verified("a", 2, 5)  # only 2 of the 3 tokens were verified; accepted is clipped to them
    rec.verified("a", 3, 3)  # already taken: ignored
    rec.verified("b", 3, 3)  # never sent: ignored
    assert rec.tokens.sum() == 2 and rec.accepted.sum() == 2
    other = ReliabilityRecord()
    other.add(PROBLEM, [0.5], [0.5], 0)
    rec.merge(other)
    assert rec.tokens[PROBLEM, 0] == 2 and rec.accepted[PROBLEM, 0] == 1


def test_bad_records_are_refused():
    rec = ReliabilityRecord()
    with pytest.raises(ValueError):
        rec.add(len(SOURCE_ORDER), [0.5], [0.5], 0)
    with pytest.raises(ValueError):
        rec.add(PROBLEM, [0.5, 0.4], [0.5], 0)
    with pytest.raises(ValueError):
        rec.add(PROBLEM, [0.5], [0.5], 2)
    with pytest.raises(ValueError):
        rec.add(PROBLEM, [1.5], [0.5], 0)
    assert rec.tokens.sum() == 0


def test_table_and_plot(tmp_path):
    rec = ReliabilityRecord()
    rec.add(PROBLEM, [0.9] * 40, [0.9] * 40, 35)
    text = format_reliability([("set 0.025", rec.to_dict())], min_tokens=1)
    assert "set 0.025" in text and "0.900/1.000" in text
    path = write_reliability_plot([("set 0.025", rec.to_dict())], tmp_path / "rel.png")
    assert path.exists() and path.stat().st_size > 1000

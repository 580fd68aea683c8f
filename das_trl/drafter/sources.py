"""The draft sources both drafter implementations choose between, and the match-length buckets their acceptance
calibration is kept in.

The order matters: ties between equally good candidates go to the earlier source (most specific first), and
``DraftBatch.source`` stores an index into :data:`SOURCE_ORDER` (the native core's ``common.h`` uses the same order).
"""

from __future__ import annotations

#: Draft sources, most specific first: the problem's own history, its running siblings, the request's own prompt and
#: output, the whole running batch, all history.
SOURCE_ORDER = ("problem", "siblings", "local", "batch", "global")

#: Upper edges of the match-length buckets (context tokens matched): 1, 2, 3-4, 5-8, 9+.
MATCH_BUCKETS = (1, 2, 4, 8)


#: Upper edges of the draft-position buckets of the acceptance calibration (1-based positions): 1, 2, 3-4, 5-8, 9-16,
#: 17-32, 33+.
POSITION_BUCKETS = (1, 2, 4, 8, 16, 32)


def position_bucket(position: int) -> int:
    """Bucket index of a 0-based draft position (0 .. len(POSITION_BUCKETS))."""
    for i, edge in enumerate(POSITION_BUCKETS):
        if position < edge:
            return i
    return len(POSITION_BUCKETS)


def match_bucket(match_len: int) -> int:
    """Bucket index of a match length (0 .. len(MATCH_BUCKETS))."""
    for i, edge in enumerate(MATCH_BUCKETS):
        if match_len <= edge:
            return i
    return len(MATCH_BUCKETS)

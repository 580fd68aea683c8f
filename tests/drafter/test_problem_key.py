import hashlib
import subprocess
import sys

import numpy as np
import pytest

from das_trl.drafter import problem_key

IDS = [1, 2, 3, 100, 127, 0]


def test_same_key_for_all_containers_and_dtypes():
    ref = problem_key(IDS)
    assert problem_key(tuple(IDS)) == ref
    for dt in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64):
        assert problem_key(np.asarray(IDS, dtype=dt)) == ref, dt


def test_value_is_blake2b_of_int32_le_and_63_bit():
    expected = int.from_bytes(
        hashlib.blake2b(np.asarray(IDS, "<i4").tobytes(), digest_size=8).digest(), "little"
    ) & ((1 << 63) - 1)
    key = problem_key(IDS)
    assert key == expected
    assert 0 <= key < 2**63


def test_distinct_prompts_distinct_keys():
    assert problem_key([1, 2, 3]) != problem_key([1, 2, 4])
    assert problem_key([1, 2]) != problem_key([2, 1])
    assert problem_key([]) == problem_key(np.zeros(0, np.int64))


def test_stable_across_processes():
    code = "from das_trl.drafter import problem_key; print(problem_key(%r))" % (IDS,)
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout.strip()
        for seed in ("1", "2")
    }
    assert outs == {str(problem_key(IDS))}


@pytest.mark.parametrize("bad", [[1.5, 2.0], [-1, 2], [2**31], [[1, 2]], ["a"]])
def test_invalid_ids_raise(bad):
    with pytest.raises(ValueError):
        problem_key(bad)

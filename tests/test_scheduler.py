"""das-trl's scheduler (``das_trl/vllm/scheduler.py``) on vLLM's own request queues, without an engine: drafts are cut
so that the step's token budget covers the decoding rows, the running prefills and the waiting requests vLLM could
admit now (free slots, KV blocks) before any draft token; nothing is cut when nothing waits or the drafts fit.
(The engine cases, steps to first token against the engine without speculation: ``tests/test_engine_admission.py``.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from vllm.v1.request import RequestStatus

from das_trl.vllm.engine import SCHEDULER_QUALNAME, das_engine_kwargs, das_server_args
from das_trl.vllm.scheduler import DASScheduler

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 128
K = 8


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_admission", ROOT / "scripts" / "bench_admission.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_FAKES = _load_script()  # a scheduler's state without an engine: the benchmark's --scheduler-cost uses it too
_request = _FAKES.fake_request


def _scheduler(running, waiting=(), **limits):
    return _FAKES.fake_scheduler(running, waiting, budget=BUDGET, num_speculative_tokens=K, **limits)


def _drafts(sched):
    return [len(r.spec_token_ids) for r in sched.running]


def test_das_engines_and_servers_run_the_scheduler_vllm_resolves():
    from vllm.config import SchedulerConfig

    assert das_engine_kwargs(8)["scheduler_cls"] == SCHEDULER_QUALNAME
    args = das_server_args(8)
    assert args[args.index("--scheduler-cls") + 1] == SCHEDULER_QUALNAME
    config = SchedulerConfig.default_factory(scheduler_cls=SCHEDULER_QUALNAME)
    assert config.get_scheduler_cls() is DASScheduler


def test_nothing_is_cut_when_nothing_waits_or_the_drafts_fit():
    rows = [_request(100, drafts=4) for _ in range(24)]  # 24 + 96 = 120 tokens
    assert _scheduler(rows).leave_room_for_waiting() == 0 and _drafts(_scheduler(rows)) == [4] * 24
    sched = _scheduler(rows, waiting=[_request(8, computed=0, status=RequestStatus.WAITING)])
    assert sched.leave_room_for_waiting() == 0  # 120 + 8 fits the 128
    assert _drafts(sched) == [4] * 24


def test_a_burst_takes_the_budget_before_any_draft():
    rows = [_request(600, drafts=K) for _ in range(24)]
    burst = [_request(30, computed=0, status=RequestStatus.WAITING) for _ in range(24)]
    sched = _scheduler(rows, burst)
    assert sched.leave_room_for_waiting() == 24 * K  # 24 rows + 720 prompt tokens > 128: no room for drafts
    assert _drafts(sched) == [0] * 24 and sched.cut_steps == 1


def test_drafts_get_what_the_waiting_prompt_leaves_far_positions_first():
    rows = [_request(600, drafts=K) for _ in range(24)]
    sched = _scheduler(rows, [_request(30, computed=0, status=RequestStatus.WAITING)])
    sched.leave_room_for_waiting()
    kept = _drafts(sched)
    assert sum(kept) == BUDGET - 24 - 30  # 74 draft tokens: 3 per row, one more for the first 2
    assert kept == [4, 4] + [3] * 22
    assert sched.running[0].spec_token_ids == [1, 2, 3, 4]  # a prefix of the draft is kept


def test_a_running_prefill_is_served_before_drafts():
    rows = [_request(600, drafts=K) for _ in range(8)] + [_request(300, computed=200)]
    sched = _scheduler(rows)
    sched.leave_room_for_waiting()
    assert sum(_drafts(sched)) == BUDGET - 8 - 100  # the prefill's 100 prompt tokens left come first


@pytest.mark.parametrize("why", ["no free slot", "no KV blocks", "not admittable", "no chunked prefill"])
def test_no_room_is_kept_for_a_request_vllm_would_not_admit_this_step(why):
    rows = [_request(600, drafts=4) for _ in range(24)]  # 120 tokens: fits alone
    status = RequestStatus.WAITING_FOR_REMOTE_KVS if why == "not admittable" else RequestStatus.WAITING
    waiting = [_request(300 if why == "no chunked prefill" else 40, computed=0, status=status)]
    sched = _scheduler(rows, waiting, max_num_seqs=24 if why == "no free slot" else 64,
                       free_blocks=2 if why == "no KV blocks" else 10_000, chunked=why != "no chunked prefill")
    assert sched.leave_room_for_waiting() == 0
    assert _drafts(sched) == [4] * 24


def test_prefix_cache_hits_and_one_token_admissions():
    def rows():
        return [_request(600, drafts=K) for _ in range(24)]

    # 33 of a 40-token prompt in the prefix cache (a GRPO sibling): 7 tokens to compute, the drafts keep 128 - 24 - 7
    hit = _scheduler(rows(), [_request(40, computed=0, status=RequestStatus.WAITING)], caching=True, hit=33)
    hit.leave_room_for_waiting()
    assert sum(_drafts(hit)) == BUDGET - 24 - 7
    # one token left: vLLM pads its admission to 1 + K tokens (or does not admit it), so 1 + K are kept for it
    one = _scheduler(rows(), [_request(40, computed=39, status=RequestStatus.PREEMPTED)])
    one.leave_room_for_waiting()
    assert sum(_drafts(one)) == BUDGET - 24 - (1 + K)
    # ... unless the padding is off (a dynamic speculation lookup): then one token
    unpadded = _scheduler(rows(), [_request(40, computed=39, status=RequestStatus.PREEMPTED)])
    unpadded.dynamic_sd_lookup = [K] * 65
    unpadded.leave_room_for_waiting()
    assert sum(_drafts(unpadded)) == BUDGET - 24 - 1

"""Engine steps to first token for requests that arrive while a DAS engine drafts (CPU engine, real vLLM, the
packaged model), against the engine without speculation.

    python scripts/bench_admission.py                      # vLLM's scheduler and das-trl's, K 8 and 64
    python scripts/bench_admission.py --ks 64 --schedulers das
    python scripts/bench_admission.py --scheduler-cost     # the scheduler's own CPU time per step, no engine

The engine: ``max_num_batched_tokens`` 128 with chunked prefill, engine core in this process (one ``step()`` is one
scheduler step). 24 rows (a chat prompt and a greedy completion, ``--row-tokens`` in all) whose completions are
in the drafter's history, so their drafts are accepted, decode; once each has ``--warm`` tokens, either (burst) 24 short
prompts or (late) 4 prompts of ``--late-tokens`` tokens arrive at once. Printed per arriving request: engine steps
from its arrival to its first token, for the engine without speculation and for each DAS engine (``vllm``: vLLM's
scheduler, as before das-trl's scheduler existed; ``das``: :class:`das_trl.vllm.scheduler.DASScheduler`), with
the worst ratio to the engine without speculation. Greedy outputs are checked against the engine without
speculation. Takes a few minutes per engine on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

BUDGET = 128
NUM_ROWS = 24
NUM_BURST = 24
NUM_LATE = 4


def make_engine(model_path: str, num_speculative_tokens: int | None = None, scheduler: str = "das",
                max_model_len: int = 1024) -> Any:
    """A CPU ``vllm.LLM`` with the scenario's scheduling limits whose engine core runs in this process.

    Args:
        num_speculative_tokens: K for a DAS engine; ``None``: no speculation.
        scheduler: ``"das"`` (das-trl's scheduler, what :func:`~das_trl.vllm.engine.das_engine_kwargs` passes) or
            ``"vllm"`` (vLLM's own).
    """
    from vllm import LLM

    from das_trl.vllm.engine import das_engine_kwargs

    extra: dict[str, Any] = {}
    if num_speculative_tokens:
        extra = das_engine_kwargs(num_speculative_tokens)
        if scheduler == "vllm":
            extra["scheduler_cls"] = None
    # KV cache: 24 rows of 600 tokens and the arrivals are ~17k tokens at 46 KB each (SmolLM2-135M, float32): 1 GiB
    # holds them all, so no request is preempted or held back for memory.
    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        return LLM(model=model_path, dtype="float32", max_model_len=max_model_len, kv_cache_memory_bytes=1024**3,
                   enforce_eager=True, seed=0, disable_log_stats=False, max_num_batched_tokens=BUDGET,
                   enable_chunked_prefill=True, max_num_seqs=64, **extra)
    finally:
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old


def scenario_prompts(model_path: str, late_tokens: int = 300, short: bool = False) -> dict[str, list[list[int]]]:
    """The rows' prompts, the burst's short prompts and the late prompts (``late_tokens`` ids each).

    Args:
        short: plain-text row and burst prompts of about 10 tokens (the tests: less prefill to compute) instead of
            chat prompts (about 50 tokens with the model's system prompt).
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)

    def chat(text: str) -> list[int]:
        if short:
            return list(tok(text)["input_ids"])
        return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False))

    rows = [chat(f"Write a long story about a town called Number {i}, one event per paragraph.")
            for i in range(NUM_ROWS)]
    burst = [chat(f"Count from {i} to {i + 12}, separated by commas.") for i in range(NUM_BURST)]
    late = []
    for i in range(NUM_LATE):
        text = " ".join(f"Report {i}, item {j}: the value of box {j * (i + 3)} is {j * j + i}." for j in range(60))
        late.append(list(tok(text)["input_ids"])[:late_tokens])
    return {"rows": rows, "burst": burst, "late": late}


def greedy(max_tokens: int, ignore_eos: bool = False) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)


def reference_rows(llm: Any, rows: list[list[int]], row_tokens: int) -> list[list[int]]:
    """The rows' greedy completions (``row_tokens`` - prompt tokens each, past any end-of-sequence token), from the
    engine without speculation; its prefix cache is reset afterwards so the measured run starts cold."""
    outputs = llm.generate([{"prompt_token_ids": p} for p in rows],
                           [greedy(row_tokens - len(p), ignore_eos=True) for p in rows], use_tqdm=False)
    llm.reset_prefix_cache()
    return [list(o.outputs[0].token_ids) for o in outputs]


def steps_to_first_token(llm: Any, rows: list[list[int]], completions: list[list[int]], arrivals: list[list[int]],
                         warm: int = 4, arrival_tokens: int = 8) -> dict[str, Any]:
    """Run the rows until each has ``warm`` output tokens, add ``arrivals`` at once, and count engine steps (one
    ``llm.llm_engine.step()`` each) from their arrival to each one's first token; then finish the arrivals
    (``arrival_tokens`` greedy tokens) and abort the rows.

    Returns:
        ``steps`` (``list[int]``, per arrival), ``arrival_outputs`` (their greedy tokens), ``rows_match`` (every
        row's output so far is a prefix of its reference completion) and ``total_steps``.
    """
    engine = llm.llm_engine
    tokens: dict[str, list[int]] = {}
    finished: set[str] = set()

    def step() -> None:
        for out in engine.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
            if out.finished:
                finished.add(out.request_id)

    row_ids = [f"row-{i}" for i in range(len(rows))]
    for rid, prompt, completion in zip(row_ids, rows, completions):
        engine.add_request(rid, {"prompt_token_ids": prompt}, greedy(len(completion), ignore_eos=True))
    total = 0
    while not all(len(tokens.get(r, ())) >= warm for r in row_ids):
        step()
        total += 1
    new_ids = [f"new-{j}" for j in range(len(arrivals))]
    for rid, prompt in zip(new_ids, arrivals):
        engine.add_request(rid, {"prompt_token_ids": prompt}, greedy(arrival_tokens))
    first: dict[str, int] = {}
    n = 0
    while len(first) < len(new_ids) or not finished.issuperset(new_ids):
        step()
        n += 1
        for rid in new_ids:
            if rid not in first and tokens.get(rid):
                first[rid] = n
        if n > 5000:
            raise RuntimeError("arrivals did not finish in 5000 steps")
    rows_match = all(tokens.get(r, []) == c[: len(tokens.get(r, []))] for r, c in zip(row_ids, completions))
    engine.abort_request([r for r in row_ids if r not in finished])
    while engine.has_unfinished_requests():
        step()
    return {"steps": [first[r] for r in new_ids], "arrival_outputs": [tokens[r] for r in new_ids],
            "rows_match": rows_match, "total_steps": total + n}


def run_engine(model_path: str, k: int | None, scheduler: str, prompts: dict[str, list[list[int]]],
               completions: list[list[int]], warm: int) -> dict[str, Any]:
    """Both cases (burst, late) on one engine (DAS engines get the rows' completions as history first)."""
    from das_trl.bench.live.engine import shutdown_engine
    from das_trl.vllm.client import LocalDASEngine
    from das_trl.vllm.metrics import spec_decode_counters

    llm = make_engine(model_path, k, scheduler)
    try:
        das = None
        if k:
            das = LocalDASEngine(llm)
            das.attach()
            das.add_history(prompts["rows"], completions)
        result: dict[str, Any] = {}
        for case in ("burst", "late"):
            result[case] = steps_to_first_token(llm, prompts["rows"], completions, prompts[case], warm=warm)
        if das is not None:
            result["proposer"] = das.stats()
            result["spec_decode"] = spec_decode_counters(llm)
            sched = llm.llm_engine.engine_core.engine_core.scheduler
            result["cut_draft_tokens"] = int(getattr(sched, "cut_draft_tokens", 0))
        return result
    finally:
        shutdown_engine(llm)


def fake_request(num_tokens: int, computed: int | None = None, drafts: int = 0, status: Any = None) -> Any:
    """A request as :class:`~das_trl.vllm.scheduler.DASScheduler` reads it: ``num_tokens`` known tokens, ``computed``
    of them in the KV cache (default: all but the last, a decoding row), ``drafts`` draft tokens, vLLM's
    ``RequestStatus`` (default ``RUNNING``)."""
    from types import SimpleNamespace

    from vllm.v1.request import RequestStatus

    return SimpleNamespace(num_tokens=num_tokens, num_computed_tokens=num_tokens - 1 if computed is None else computed,
                           num_output_placeholders=0, spec_token_ids=list(range(1, drafts + 1)),
                           status=RequestStatus.RUNNING if status is None else status)


def fake_scheduler(running: list, waiting: list = (), budget: int = BUDGET, num_speculative_tokens: int = 8,
                   free_blocks: int = 10_000, max_num_seqs: int = 64, chunked: bool = True, caching: bool = False,
                   hit: int = 0) -> Any:
    """A ``DASScheduler`` over vLLM's own request queue without an engine: ``running`` / ``waiting`` requests
    (:func:`fake_request`), a token budget, ``free_blocks`` KV blocks of 16 tokens, ``max_num_seqs`` rows, chunked
    prefill or not, a prefix cache (``caching``) that holds ``hit`` tokens of every prompt."""
    from types import SimpleNamespace

    from vllm.v1.core.sched.request_queue import FCFSRequestQueue

    from das_trl.vllm.scheduler import DASScheduler

    sched = object.__new__(DASScheduler)
    sched.running = list(running)
    sched.waiting, sched.kv_holding_waiting = FCFSRequestQueue(), FCFSRequestQueue()
    for request in waiting:
        sched.waiting.add_request(request)
    sched.scheduler_config = SimpleNamespace(max_num_batched_tokens=budget, long_prefill_token_threshold=0,
                                             long_prefill_token_threshold_adaptive=False,
                                             enable_chunked_prefill=chunked, max_num_seqs=max_num_seqs)
    sched.max_num_scheduled_tokens = budget
    sched.max_num_running_reqs = sched.max_num_active_reqs = max_num_seqs
    sched.num_waiting_for_streaming_input = 0
    sched.kv_cache_manager = SimpleNamespace(block_pool=SimpleNamespace(get_num_free_blocks=lambda: free_blocks),
                                             watermark_blocks=0, enable_caching=caching,
                                             get_computed_blocks=lambda request: (None, hit, 0))
    sched.kv_cache_config = SimpleNamespace(kv_cache_groups=[object()])
    sched.block_size, sched.connector, sched.dynamic_sd_lookup = 16, None, None
    sched.num_spec_tokens = num_speculative_tokens
    # vLLM keeps a set of the requests still prefilling; a list (the fakes are not hashable) answers the same test
    sched._inflight_prefills = [r for r in running if r.num_tokens - r.num_computed_tokens > 1]
    return sched


def scheduler_cost(reps: int = 2000) -> None:
    """Print the thread CPU time of ``DASScheduler.leave_room_for_waiting`` per engine step (on fakes: the cost it
    adds to vLLM's own ``schedule``) for 64-1024 running rows drafting 4 tokens each."""
    import time

    from vllm.v1.request import RequestStatus

    def timed(rows: int, waiting: int, max_num_seqs: int) -> float:
        sched = fake_scheduler([fake_request(600, drafts=4) for _ in range(rows)],
                               [fake_request(40, 0, status=RequestStatus.WAITING) for _ in range(waiting)],
                               budget=100_000, max_num_seqs=max_num_seqs)
        start = time.thread_time()
        for _ in range(reps):
            sched.leave_room_for_waiting()
        return (time.thread_time() - start) / reps * 1e6

    print("DASScheduler.leave_room_for_waiting, thread CPU time per step (us)")
    print(f"  {'rows':>5} {'nothing waits':>14} {'512 wait, no free row':>22} {'64 admissible':>14}")
    for rows in (64, 256, 1024):
        print(f"  {rows:>5} {timed(rows, 0, rows + 64):>14.1f} {timed(rows, 512, rows):>22.1f} "
              f"{timed(rows, 64, rows + 64):>14.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[8, 64], help="DAS K values (default: 8 64)")
    parser.add_argument("--schedulers", nargs="+", default=["vllm", "das"], choices=["vllm", "das"])
    parser.add_argument("--row-tokens", type=int, default=600, help="prompt + completion tokens per drafting row")
    parser.add_argument("--late-tokens", type=int, default=300, help="tokens per late prompt")
    parser.add_argument("--warm", type=int, default=4, help="output tokens every row has when the arrivals come")
    parser.add_argument("--short", action="store_true",
                        help="plain-text row and burst prompts of ~10 tokens instead of chat prompts (the test's case: "
                             "--short --row-tokens 96 --warm 2)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--scheduler-cost", action="store_true",
                        help="only print the scheduler's own CPU time per step (no engine)")
    args = parser.parse_args(argv)
    if args.scheduler_cost:
        scheduler_cost()
        return 0
    from das_trl.defaults.model import prepare_default_model
    from das_trl.bench.live.engine import shutdown_engine

    model_path = prepare_default_model()
    prompts = scenario_prompts(model_path, args.late_tokens, short=args.short)
    plain = make_engine(model_path)
    try:
        completions = reference_rows(plain, prompts["rows"], args.row_tokens)
        results = {"none": {case: steps_to_first_token(plain, prompts["rows"], completions, prompts[case],
                                                       warm=args.warm) for case in ("burst", "late")}}
    finally:
        shutdown_engine(plain)
    base = results["none"]
    print("engine steps from arrival to first token, per request (burst: 24 short prompts; late: 4 long ones)")
    for case in ("burst", "late"):
        print(f"  {'none':<14} {case:<5} {base[case]['steps']}", flush=True)
    for scheduler in args.schedulers:
        for k in args.ks:
            name = f"das K{k} {scheduler}"
            res = results[name] = run_engine(model_path, k, scheduler, prompts, completions, args.warm)
            for case in ("burst", "late"):
                steps = res[case]["steps"]
                worst = max(s / b for s, b in zip(steps, base[case]["steps"]))
                same = res[case]["arrival_outputs"] == base[case]["arrival_outputs"] and res[case]["rows_match"]
                print(f"  {name:<14} {case:<5} {steps}  worst ratio {worst:.2f}, greedy identical: {same}")
            p, s = res["proposer"], res["spec_decode"]
            print(f"  {name:<14} proposer offered {p['draft_tokens']} draft tokens, vLLM verified "
                  f"{s['num_draft_tokens']} and accepted {s['num_accepted_tokens']}; the scheduler cut "
                  f"{res['cut_draft_tokens']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

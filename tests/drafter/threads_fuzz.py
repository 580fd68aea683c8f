"""Randomized comparison of one drafting thread against several: NativeDASDrafter with draft_threads=1 and with 2, 3,
4 or 8 on the same random engine-like workload (random DrafterConfig; preemptions, prompt changes, starts / stops /
aborts mid-run, history pushes, rows without new tokens, step_slots with reused buffers and late release, trims,
propose_batch, extend_request). The threaded core appends a drafting step's rows on its drafting threads
(Drafter::step, queue_extend, run_queued_extends; LivePool::add_catch_up / catch_up_task / end_catch_up) and drafts
rows there: every output must be the one thread's, bit for bit.

Every step compares the whole DraftBatch (tokens, accept, lengths, source, match_len); every 17 steps and at the end
the core's counters (timing fields and gauges excluded), acceptance totals and calibration tables; check() on both
every 51 steps and at the end. tests/drafter/test_parallel_extend.py runs a few dozen seeds; for a long run:

    python tests/drafter/threads_fuzz.py --seconds 600 [--seed0 0] [--only SEED --verbose] [--log FILE.jsonl]

(exit status 1 and the seed, config and traceback printed on a mismatch).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

from das_trl.drafter import DraftBatch, DrafterConfig, NativeDASDrafter

TIMING = {"ingest_background_seconds", "ingest_last_seconds", "ingest_background_cpu_seconds",
          "ingest_thread_cpu_seconds", "caller_ingests", "ingest_waits", "ingest_wakeups", "update_seconds",
          "pending_updates", "update_builds", "ingest_queued_tokens"}  # timing or gauges
FIELDS = ("tokens", "accept", "lengths", "source", "match_len")


class Mismatch(Exception):
    pass


def random_config(rng: np.random.Generator) -> tuple[dict, dict]:
    """(DrafterConfig kwargs without draft_threads, workload params)."""
    depth = int(rng.choice([4, 8, 16, 32, 64]))
    cfg = dict(
        backend="native",
        support_table_bits=12,
        builder_threads=1,
        max_tree_depth=depth,
        match_context_tokens=int(rng.integers(1, min(32, depth) + 1)),
        max_spec_tokens=int(rng.choice([1, 2, 3, 5, 8, 16, 32, 64])),
        max_spec_factor=float(rng.choice([0.5, 1.0, 2.0, 4.0])),
        max_spec_offset=float(rng.choice([-2.0, 0.0, 1.0, 4.0])),
        min_token_prob=float(rng.choice([0.0, 0.05, 0.1, 0.3])),
        min_match_len=int(rng.choice([1, 1, 2, 3])),
        prompt_tail_tokens=int(rng.choice([0, 1, 4, 32])),
        window=int(rng.choice([1, 2, 16])),
        recent_appearance_weight=int(rng.choice([1, 2])),
        use_problem_tree=bool(rng.random() < 0.8),
        use_global_tree=bool(rng.random() < 0.8),
        global_samples_per_appearance=int(rng.choice([0, 1, 4])),
        use_local_tree=bool(rng.random() < 0.6),
        share_running_siblings=bool(rng.random() < 0.7),
        share_running_batch=bool(rng.random() < 0.7),
        live_token_budget=int(rng.choice([0, 1, 20, 100, 300, 1000, 2_000_000])),
        support_ngram=2,
        truncate_by_evidence=bool(rng.random() < 0.7),
        calibrate_acceptance=bool(rng.random() < 0.7),
        background_ingest=bool(rng.random() < 0.6),
        defer_idle_rows=bool(rng.random() < 0.6),
        defer_shared_ingest=bool(rng.random() < 0.3),
    )
    cfg["support_ngram"] = int(rng.integers(2, min(4, depth) + 1))
    work = dict(
        vocab=int(rng.integers(4, 51)),
        n_problems=int(rng.integers(1, 7)),
        max_rows=int(rng.choice([4, 6, 8, 12, 16, 24, 32, 48, 64])),
        out_len=int(rng.choice([20, 60, 120])),
        steps=int(rng.integers(60, 260)),
        p_zero_step=float(rng.choice([0.0, 0.2, 0.5])),
        p_idle_row=float(rng.choice([0.0, 0.2, 0.5])),
        p_stall=float(rng.choice([0.0, 0.1, 0.3])),
        p_preempt=float(rng.choice([0.02, 0.08, 0.2])),
        p_subset=float(rng.choice([0.0, 0.2, 0.5])),
    )
    return cfg, work


def same_batch(a: DraftBatch, b: DraftBatch) -> str:
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if not np.array_equal(x, y):
            bad = np.nonzero((x != y).reshape(len(x), -1).any(axis=1))[0] if x.ndim > 1 else np.nonzero(x != y)[0]
            return f"{f} differs at rows {bad[:8].tolist()}"
    return ""


def core_counters(d: NativeDASDrafter) -> dict:
    s = d._core.stats()
    return {k: v for k, v in s.items() if k not in TIMING}


def compare_state(one: NativeDASDrafter, many: NativeDASDrafter, where: str, check: bool) -> None:
    a, b = core_counters(one), core_counters(many)
    if a != b:
        diff = {k: (a[k], b[k]) for k in a if a[k] != b.get(k)}
        raise Mismatch(f"{where}: counters differ {diff}")
    if one.acceptance_totals() != many.acceptance_totals():
        raise Mismatch(f"{where}: acceptance totals differ")
    if one.calibration() != many.calibration():
        raise Mismatch(f"{where}: calibration differs")
    if check:
        for name, d in (("one", one), ("many", many)):
            e = d.check()
            if e != "":
                raise Mismatch(f"{where}: check() on {name}: {e!r}")


class Engine:
    def __init__(self, seed: int, cfg: dict, work: dict, threads: int, verbose: bool = False) -> None:
        self.rng = np.random.default_rng(seed + 1_000_003)
        self.cfg, self.w, self.verbose = cfg, work, verbose
        self.one = NativeDASDrafter(DrafterConfig(draft_threads=1, **cfg))
        self.many = NativeDASDrafter(DrafterConfig(draft_threads=threads, **cfg))
        self.d = (self.one, self.many)
        V = work["vocab"]
        rng = self.rng
        self.V = V
        self.prompts = [self.new_prompt() for _ in range(work["n_problems"])]
        self.bases = [rng.integers(100, 100 + V, work["out_len"]).tolist() for _ in range(work["n_problems"])]
        self.width = 48 + work["out_len"] + 8
        self.matrix = np.zeros((work["max_rows"] + 2, self.width), np.int32)
        self.free = list(range(work["max_rows"] + 2))
        self.rng.shuffle(self.free)
        self.live: dict[str, dict] = {}
        self.count = 0
        self.finished: list[tuple[list[int], list[int]]] = []
        self.cov = dict(steps=0, rows=0, drafting_steps=0, par_steps=0, preempt=0, prompt_change=0, zero_out=0,
                        stall_rows=0, pushes=0, starts=0, stops=0, early_stops=0, extend_api=0, propose_batch=0,
                        slot_api=0, trims=0, max_drafting=0)
        # mirror of the core's per-slot view, to count the steps that take the parallel path
        self.seen: dict[str, tuple[int, int]] = {}

    def new_prompt(self) -> list[int]:
        n = int(self.rng.integers(0, 41)) if self.rng.random() < 0.05 else int(self.rng.integers(1, 41))
        return self.rng.integers(100, 100 + 3 * self.V, n).tolist()

    def write_row(self, st: dict) -> None:
        row, pr = st["row"], st["prompt"]
        self.matrix[row, :] = 0
        self.matrix[row, :len(pr)] = pr
        self.matrix[row, len(pr):len(pr) + st["pos"]] = st["target"][:st["pos"]]

    def start(self) -> None:
        rng = self.rng
        row = self.free.pop()
        p = int(rng.integers(len(self.prompts)))
        target = list(self.bases[p])
        for _ in range(int(rng.integers(0, 12))):
            target[int(rng.integers(len(target)))] = int(rng.integers(100, 100 + self.V))
        rid = f"r{self.count}"
        self.count += 1
        prompt = list(self.prompts[p])
        first = int(rng.integers(1, 30)) if rng.random() < 0.5 else 1
        first = min(first, len(target) - 1)
        stop_at = len(target) if rng.random() < 0.7 else int(rng.integers(first + 1, len(target) + 1))
        st = dict(row=row, problem=p, prompt=prompt, target=target, pos=first, stop_at=stop_at, last=first,
                  verified=-1)
        self.live[rid] = st
        self.write_row(st)
        key = int(rng.integers(0, 2**40)) if rng.random() < 0.1 else None  # sometimes an explicit problem key
        st["key"] = key
        for d in self.d:
            d.start_request(rid, prompt, key)
        self.seen[rid] = (0, len(prompt))
        self.cov["starts"] += 1

    def stop(self, rid: str, early: bool) -> None:
        st = self.live.pop(rid)
        for d in self.d:
            d.stop_request(rid)
        out = st["target"][:st["pos"]]
        if st["key"] is None:
            self.finished.append((st["prompt"], out))
        self.free.append(st["row"])
        self.seen.pop(rid)
        self.cov["stops"] += 1
        self.cov["early_stops"] += early

    def preempt(self, rid: str) -> None:
        st = self.live[rid]
        self.cov["preempt"] += 1
        if self.rng.random() < 0.3:  # recomputed with a different prompt (its length changes)
            old = len(st["prompt"])
            while True:
                pr = self.new_prompt()
                if len(pr) != old:
                    break
            st["prompt"] = pr
            self.cov["prompt_change"] += 1
            st["pos"] = int(self.rng.integers(0, st["pos"] + 1))
        else:
            st["pos"] = int(self.rng.integers(0, max(1, st["pos"])))
        self.cov["zero_out"] += st["pos"] == 0
        st["last"] = 1 if st["pos"] else 0
        st["verified"] = -1
        self.write_row(st)

    def step_once(self, step: int) -> None:
        rng, w = self.rng, self.w
        ids = list(self.live)
        if ids and rng.random() < w["p_subset"]:  # only some of the running requests are scheduled
            keep = rng.random(len(ids)) < 0.7
            ids = [r for r, k in zip(ids, keep) if k]
        if len(ids) > 1 and rng.random() < 0.3:
            rng.shuffle(ids)
        if ids and rng.random() < w["p_preempt"]:
            for rid in rng.choice(ids, size=int(rng.integers(1, min(3, len(ids)) + 1)), replace=False):
                self.preempt(str(rid))
        n = len(ids)
        K = self.cfg["max_spec_tokens"]
        zero = rng.random() < w["p_zero_step"]
        if zero:
            budgets = np.zeros(n, np.int32) if rng.random() < 0.7 else -np.ones(n, np.int32)
        else:
            budgets = rng.integers(1, K + 4, n).astype(np.int32)
            idle = rng.random(n) < w["p_idle_row"]
            budgets[idle] = rng.integers(-1, 1, int(idle.sum()))
        rows = np.array([self.live[r]["row"] for r in ids], np.int32)
        num_prompt = np.array([len(self.live[r]["prompt"]) for r in ids], np.int32)
        num_tokens = num_prompt + np.array([self.live[r]["pos"] for r in ids], np.int32)
        sampled = np.array([self.live[r]["last"] for r in ids], np.int32)
        verified = np.array([self.live[r]["verified"] for r in ids], np.int32)

        # coverage: does the threaded drafter take the parallel-extend path in this step?
        drafting = bool((budgets > 0).any())
        bg = self.cfg["background_ingest"]
        late = bg and drafting and self.cfg["defer_shared_ingest"]
        late_idle = bg and drafting and (self.cfg["defer_shared_ingest"] or self.cfg["defer_idle_rows"])
        appending = 0
        if drafting and not late:
            for j, r in enumerate(ids):
                seen, plen = self.seen[r]
                out_len = int(num_tokens[j] - num_prompt[j])
                if not (late_idle and budgets[j] <= 0) and seen < out_len and plen == num_prompt[j]:
                    appending += 1
        self.cov["par_steps"] += appending >= 4
        self.cov["drafting_steps"] += drafting
        self.cov["max_drafting"] = max(self.cov["max_drafting"], int((budgets > 0).sum()))
        for j, r in enumerate(ids):
            self.seen[r] = (int(num_tokens[j] - num_prompt[j]), int(num_prompt[j]))

        args = (rows, num_tokens, num_prompt, sampled, verified, budgets)
        use_slots = rng.random() < 0.3
        release = True
        if use_slots:
            self.cov["slot_api"] += 1
            release = bool(rng.random() < 0.5)
            outs = []
            for d in self.d:
                slots = np.array([d.slot_of(r) for r in ids], np.int32)
                buf = DraftBatch.empty(n, K)
                buf.tokens[:] = 7
                buf.accept[:] = 0.5
                buf.lengths[:] = 3
                outs.append(d.step_slots(slots, self.matrix, *args, out=buf, release=release))
            ba, bb = outs
        else:
            ba, bb = (d.step(ids, self.matrix, *args) for d in self.d)
        self.cov["steps"] += 1
        self.cov["rows"] += n
        e = same_batch(ba, bb)
        if e:
            raise Mismatch(f"step {step}: {e}")

        sent = ba.lengths.copy()
        if n and rng.random() < 0.3:
            sent = np.minimum(sent, rng.integers(0, K + 1, n)).astype(np.int32)
            for d in self.d:
                d.trim(ids, sent)
            self.cov["trims"] += 1
        if not release:
            for d in self.d:
                d.release_ingest()

        for j, rid in enumerate(ids):
            st = self.live[rid]
            if rng.random() < w["p_stall"]:  # no new token this step (e.g. waiting, chunked prefill of another)
                st["last"] = 0
                st["verified"] = -1
                self.cov["stall_rows"] += 1
                continue
            draft = ba.row(j)[: int(sent[j])]
            t, p = st["target"], st["pos"]
            usable = min(len(draft), len(t) - p - 1)
            acc = 0
            while acc < usable and draft[acc] == t[p + acc]:
                acc += 1
            if rng.random() < 0.05:  # a prefill-like chunk of several tokens
                acc = int(rng.integers(acc, max(acc, min(len(t) - p - 1, acc + 20)) + 1))
            emit = t[p:p + acc + 1]
            pr = len(st["prompt"])
            self.matrix[st["row"], pr + p:pr + p + len(emit)] = emit
            st["pos"] += len(emit)
            st["last"] = len(emit)
            st["verified"] = int(rng.integers(0, len(draft) + 1)) if draft and rng.random() < 0.2 else -1
        # requests not scheduled this step gained nothing
        for rid in self.live:
            if rid not in ids:
                self.live[rid]["last"] = 0
                self.live[rid]["verified"] = -1

        # sometimes a request gets tokens through extend_request (then they are in its row too)
        if self.live and rng.random() < 0.05:
            rid = list(self.live)[int(rng.integers(len(self.live)))]
            st = self.live[rid]
            k = int(rng.integers(1, 6))
            emit = st["target"][st["pos"]:st["pos"] + k]
            if emit and self.seen[rid][0] == st["pos"] and self.seen[rid][1] == len(st["prompt"]):
                for d in self.d:
                    d.extend_request(rid, emit)
                pr = len(st["prompt"])
                self.matrix[st["row"], pr + st["pos"]:pr + st["pos"] + len(emit)] = emit
                st["pos"] += len(emit)
                st["last"] = 0
                self.seen[rid] = (st["pos"], pr)
                self.cov["extend_api"] += 1

        for rid in list(self.live):
            st = self.live[rid]
            if st["pos"] >= st["stop_at"]:
                self.stop(rid, early=st["stop_at"] < len(st["target"]))
            elif rng.random() < 0.01:  # aborted
                self.stop(rid, early=True)
        while self.free and (len(self.live) < 4 or rng.random() < 0.3):
            self.start()
        if len(self.finished) >= 4 and rng.random() < 0.12:
            ps, cs = zip(*self.finished)
            for d in self.d:
                d.add_rollouts(list(ps), list(cs))
            self.finished.clear()
            self.cov["pushes"] += 1
        if self.live and rng.random() < 0.05:
            pids = [r for r in self.live if rng.random() < 0.6]
            bud = rng.integers(-1, K + 2, len(pids))
            e = same_batch(self.one.propose_batch(pids, bud), self.many.propose_batch(pids, bud))
            self.cov["propose_batch"] += 1
            if e:
                raise Mismatch(f"propose_batch after step {step}: {e}")
        if step % 17 == 0:
            compare_state(self.one, self.many, f"after step {step}", check=step % 51 == 0)

    def run(self) -> dict:
        for _ in range(min(len(self.free), int(self.rng.integers(4, self.w["max_rows"] + 1)))):
            self.start()
        for step in range(self.w["steps"]):
            self.step_once(step)
        compare_state(self.one, self.many, "end", check=True)
        st = self.one._core.stats()
        for k in ("drafts", "draft_tokens", "live_rebuilds", "live_evicted_outputs"):
            self.cov[k] = st[k]
        return self.cov


def run_seed(seed: int, verbose: bool) -> dict:
    rng = np.random.default_rng(seed)
    cfg, work = random_config(rng)
    threads = int(rng.choice([2, 3, 4, 8]))
    eng = Engine(seed, cfg, work, threads, verbose)
    try:
        cov = eng.run()
    except Exception as exc:
        return dict(seed=seed, ok=False, threads=threads, cfg=cfg, work=work, error=f"{type(exc).__name__}: {exc}",
                    tb=traceback.format_exc(), cov=eng.cov)
    return dict(seed=seed, ok=True, threads=threads, cfg=cfg, work=work, cov=cov)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=540)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=10**9)
    ap.add_argument("--only", type=int, default=None)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--log", default=None, help="append one JSON line per seed to this file")
    a = ap.parse_args()
    seeds = [a.only] if a.only is not None else range(a.seed0, a.seed0 + a.seeds)
    t0 = time.time()
    total = dict(seeds=0, steps=0, rows=0, par_steps=0, drafting_steps=0, preempt=0, prompt_change=0, pushes=0,
                 starts=0, stall_rows=0, zero_out=0, extend_api=0, propose_batch=0, slot_api=0, trims=0,
                 early_stops=0, drafts=0, draft_tokens=0, live_rebuilds=0, live_evicted_outputs=0)
    threads_seen, failures = {}, []
    with open(a.log if a.log else os.devnull, "a") as log:
        for seed in seeds:
            if time.time() - t0 > a.seconds:
                break
            r = run_seed(seed, a.verbose)
            log.write(json.dumps({k: v for k, v in r.items() if k != "tb"}) + "\n")
            log.flush()
            total["seeds"] += 1
            for k in total:
                if k != "seeds":
                    total[k] += r["cov"].get(k, 0)
            threads_seen[r["threads"]] = threads_seen.get(r["threads"], 0) + 1
            if a.verbose or not r["ok"]:
                print(f"seed {seed}: {'ok' if r['ok'] else 'FAIL ' + r['error']} threads={r['threads']} "
                      f"cov={r['cov']}", flush=True)
            if not r["ok"]:
                print("config:", json.dumps(r["cfg"]), "\nwork:", json.dumps(r["work"]), flush=True)
                print(r["tb"], flush=True)
                failures.append(seed)
                if len(failures) >= 5:
                    break
    print(f"{time.time() - t0:.0f}s totals {total} threads {threads_seen} failures {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Drafter CPU costs next to vLLM's ``suffix`` method (prints figures; a benchmark, not a test).

vLLM runs a ``custom_class`` drafter synchronously after sampling, on the engine's critical path, so its time per
engine step adds to every step. This benchmark drives the real proposers as vLLM calls them, on the same workload:

* DAS: :class:`das_trl.vllm.proposer.DASProposer` (one drafter ``step`` per engine step) behind a fake model runner;
* suffix: vLLM's own ``SuffixDecodingProposer`` (arctic-inference ``SuffixDecodingCache``; vLLM defaults: tree depth
  24, 24 speculative tokens, factor 1.0, min_token_prob 0.1) behind a fake input batch.

Workload: ``problems`` problems with a template each; a rollout is the template with ~10% of tokens resampled and a
few cross-problem phrases spliced in. History: ``appearances`` steps of ``samples`` rollouts per problem (capped by
``--history-tokens``). Live batch: ``batch`` requests, 8 per problem, each first given ``context`` tokens (prompt +
output so far; untimed), then ``rounds`` engine steps in which drafts are verified against the request's own rollout
(accepted prefix + 1 token).

Printed: per (batch, context) the time per request per round (wall and this thread's CPU time) and tokens per round
of each proposer; a history push of ``--push-tokens`` tokens (wall, us/token, how much of the push the GIL was free,
history bytes per token); the engine-step latency p50/p99 of the DAS proposer while that push is built in the
background next to the quiet latency.

    das-trl bench drafter-speed --compare suffix [--batch 256,1024] [--context 1024,16384] [--workload silent]

``--workload silent`` makes every live output random (nothing pays): the controller's plan stops drafting, and the
figures are what a step costs the engine when nothing pays (benchmarks/NOTES.md, "steps that draft little cost
little").
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from types import SimpleNamespace

import numpy as np

from das_trl.bench.options import int_in_range, non_negative_int, positive_int, positive_int_list
from das_trl.budget.gate import MAX_CAP
from das_trl.drafter import DrafterConfig

SUFFIX = dict(max_tree_depth=24, num_speculative_tokens=24, max_spec_factor=1.0, min_token_prob=0.1,
              max_cached_requests=10000)

#: Tokens of every synthetic prompt: a live request's ``--context`` includes its prompt, so it is at least this long
#: (a shorter one ends inside the prompt, and the controller's plan fails on its negative output length).
PROMPT_TOKENS = 64
#: Token ids are ``int32`` (0 .. vocab - 1).
_MAX_VOCAB = 2**31


class Workload:
    """Synthetic GRPO-like token streams (see the module docstring)."""

    def __init__(self, problems: int, vocab: int, length: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.prompts = [self.rng.integers(0, vocab, PROMPT_TOKENS).astype(np.int32) for _ in range(problems)]
        self.templates = [self.rng.integers(0, vocab, length).astype(np.int32) for _ in range(problems)]
        self.phrases = self.rng.integers(0, vocab, (64, 24)).astype(np.int32)

    def rollout(self, problem: int, length: int | None = None) -> np.ndarray:
        out = self.templates[problem].copy()
        mask = self.rng.random(len(out)) < 0.10
        out[mask] = self.rng.integers(0, self.vocab, int(mask.sum()))
        for _ in range(3 + len(out) // 1000):
            p = self.phrases[self.rng.integers(len(self.phrases))]
            at = self.rng.integers(0, len(out) - len(p))
            out[at:at + len(p)] = p
        return out if length is None else out[:length]

    def step(self, problems: int, samples: int, length: int) -> tuple[list, list]:
        ps, cs = [], []
        for i in range(problems):
            for _ in range(samples):
                ps.append(self.prompts[i])
                cs.append(self.rollout(i, int(self.rng.integers(length * 6 // 10, length + 1))))
        return ps, cs


class FakeBatch:
    """What both proposers read from vLLM's model runner / input batch."""

    def __init__(self, n: int, width: int) -> None:
        self.req_ids: list[str] = []
        self.req_id_to_index: dict[str, int] = {}
        self.num_prompt_tokens = np.zeros(n, np.int32)
        self.num_tokens_no_spec = np.zeros(n, np.int32)
        self.token_ids_cpu = np.zeros((n, width), np.int32)


def _vllm_config(k: int, max_model_len: int, **spec) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, **spec),
        model_config=SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: 1 << 20))


def run_batch(kind: str, wl: Workload, history: list[tuple[list, list]], batch: int, context: int, rounds: int,
              k: int, backend: str, workload: str = "drafting", warmup_rounds: int = 0,
              forward_ms: float = 0.0) -> dict:
    """One proposer on one live batch: returns per request-round costs and tokens per round.

    ``workload="silent"``: the live requests' outputs are random tokens unrelated to the history (drafts are
    rejected, the controller's plan stops drafting), so the timed steps measure what a step costs when nothing
    pays. ``warmup_rounds`` engine steps run untimed after the first (the plan learns the acceptance).
    ``forward_ms``: the engine's forward pass between two proposer calls, emulated by sleeping that long (untimed):
    the work the drafter leaves to its ingest thread then overlaps it as in an engine; 0 gives the thread only the
    time this loop takes to emit the round's tokens."""
    width = context + (rounds + warmup_rounds) * (k + 2) + 64
    fb = FakeBatch(batch, width)
    problems = [r % len(wl.prompts) for r in range(batch)]
    if workload == "silent":
        noise = np.random.default_rng(12345)
        truths = [np.concatenate([wl.prompts[p], noise.integers(0, wl.vocab, width).astype(np.int32)])[:width]
                  for p in problems]
    else:
        truths = [np.concatenate([wl.prompts[p], wl.rollout(p)])[:width] for p in problems]
    for r in range(batch):
        fb.req_ids.append(f"r{r}")
        fb.req_id_to_index[f"r{r}"] = r
        fb.num_prompt_tokens[r] = PROMPT_TOKENS
    if kind == "das":
        from das_trl.vllm.proposer import DASProposer

        prop = DASProposer(_vllm_config(k, width + 64))
        prop.drafter = __import__("das_trl.drafter", fromlist=["create_drafter"]).create_drafter(
            DrafterConfig(max_spec_tokens=k, backend=backend))
        prop.attach(SimpleNamespace(input_batch=fb, requests={}))
        for ps, cs in history:
            prop.add_history(ps, cs, background=False)
        step_time = [0.0, 0.0, 0.0]
        name = "step_slots" if hasattr(prop.drafter, "step_slots") else "step"  # what the speculator calls
        inner = getattr(prop.drafter, name)
        plan, cut = prop.controller.plan, prop.controller.cut

        def timed_step(*a, **kw):  # the drafter's share of the proposer's time
            t0, c0 = time.perf_counter(), time.thread_time()
            out = inner(*a, **kw)
            step_time[0] += time.perf_counter() - t0
            step_time[1] += time.thread_time() - c0
            return out

        def timed(fn):  # the controller's share (plan + cut), thread time
            def call(*a, **kw):
                c0 = time.thread_time()
                out = fn(*a, **kw)
                step_time[2] += time.thread_time() - c0
                return out
            return call

        setattr(prop.drafter, name, timed_step)
        prop.controller.plan, prop.controller.cut = timed(plan), timed(cut)
        call = lambda sampled: prop.propose(sampled, fb.num_tokens_no_spec.copy(), fb.token_ids_cpu)  # noqa: E731
    else:
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        prop = SuffixDecodingProposer(_vllm_config(
            SUFFIX["num_speculative_tokens"], width + 64,
            suffix_decoding_max_tree_depth=SUFFIX["max_tree_depth"],
            suffix_decoding_max_spec_factor=SUFFIX["max_spec_factor"],
            suffix_decoding_min_token_prob=SUFFIX["min_token_prob"],
            suffix_decoding_max_cached_requests=SUFFIX["max_cached_requests"]))
        cache = prop.suffix_cache
        n = 0
        for ps, cs in history:
            for p, c in zip(ps, cs):
                rid = f"h{n}"
                n += 1
                cache.start_request(rid, np.asarray(p, np.int32))
                cache.add_active_response(rid, np.asarray(c).tolist())
                cache.stop_request(rid)
        call = lambda sampled: prop.propose(SUFFIX["num_speculative_tokens"], fb, sampled)  # noqa: E731
    # Warm-up round (untimed): every request gets its first `context` tokens at once.
    pos = np.full(batch, context, np.int64)
    sampled = []
    for r in range(batch):
        fb.token_ids_cpu[r, :context] = truths[r][:context]
        fb.num_tokens_no_spec[r] = context
        sampled.append(truths[r][PROMPT_TOKENS:context].tolist())
    drafts = call(sampled)
    wall = cpu = 0.0
    rows = tokens = 0
    for rnd in range(warmup_rounds + rounds):
        if rnd == warmup_rounds:
            wall = cpu = 0.0
            rows = tokens = 0
            if kind == "das":
                # The warm-up's contexts (batch x context tokens at once: 4 M at 256 x 16k) finish ingesting before
                # timing: left to the ingest thread, they made the first timed steps wait for it (an engine's
                # prefill of those contexts takes far longer than their ingest).
                prop.drafter.wait_for_ingest()
                step_time[:] = [0.0, 0.0, 0.0]
                spec0 = dict(prop.speculator.counters)
        sampled = []
        for r in range(batch):
            d, t, p = drafts[r], truths[r], int(pos[r])
            acc = 0
            while acc < len(d) and p + acc + 1 < len(t) and d[acc] == t[p + acc]:
                acc += 1
            emit = t[p:p + acc + 1]
            fb.token_ids_cpu[r, p:p + len(emit)] = emit
            pos[r] += len(emit)
            fb.num_tokens_no_spec[r] = pos[r]
            sampled.append(emit.tolist())
            tokens += len(emit)
        t0, c0 = time.perf_counter(), time.thread_time()
        drafts = call(sampled)
        wall += time.perf_counter() - t0
        cpu += time.thread_time() - c0
        rows += batch
        if forward_ms > 0:
            time.sleep(forward_ms / 1000.0)
    out = {"us_wall": 1e6 * wall / rows, "us_cpu": 1e6 * cpu / rows, "tokens_per_round": tokens / rows}
    if kind == "das":
        out["drafter_us_wall"], out["drafter_us_cpu"], out["controller_us_cpu"] = (1e6 * x / rows for x in step_time)
        spec = prop.speculator.counters
        out["speculated_share"] = (spec["speculated_rows"] - spec0["speculated_rows"]) / rows
        out["silent_steps"] = spec["silent_steps"] - spec0["silent_steps"]
        s = prop.drafter.stats()
        out["bytes_per_history_token"] = s.get("bytes_per_history_token")
        out["live_bytes"] = s.get("live_bytes")
    return out


def push_and_stall(wl: Workload, batch: int, push_tokens: int, k: int, backend: str, rounds: int) -> dict:
    """A ``push_tokens`` history push: synchronous cost, GIL availability, and engine-step latency while it is
    built in the background."""
    from das_trl.drafter import create_drafter

    problems = min(len(wl.prompts), max(1, push_tokens // (16 * 500)))
    ps, cs = wl.step(problems, 16, max(1, push_tokens // (problems * 16)) * 5 // 4)
    ntok = sum(len(c) for c in cs)
    d = create_drafter(DrafterConfig(max_spec_tokens=k, backend=backend))
    # GIL probe: a Python thread counting while the push runs; its rate against an idle second tells how much of
    # the push the interpreter was free.
    stop = threading.Event()
    count = [0]

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    time.sleep(0.3)
    c0 = count[0]
    time.sleep(0.5)
    idle_rate = (count[0] - c0) / 0.5
    c0, t0 = count[0], time.perf_counter()
    d.add_rollouts(ps, cs, background=True)
    handed_back = time.perf_counter() - t0
    d.wait_for_updates()
    seconds = time.perf_counter() - t0
    busy_rate = (count[0] - c0) / seconds
    stop.set()
    t.join()
    out = {"push_tokens": ntok, "push_seconds": seconds, "push_us_per_token": 1e6 * seconds / ntok,
           "push_returns_after_s": handed_back, "gil_free_share": min(1.0, busy_rate / max(idle_rate, 1.0)),
           "bytes_per_history_token": d.stats().get("bytes_per_history_token")}
    # Stall: a batch keeps proposing (one step per call) while a second push of the same size builds.
    for r in range(batch):
        p = r % problems
        d.start_request(f"r{r}", wl.prompts[p])
        d.extend_request(f"r{r}", wl.rollout(p, 256))
    ids = [f"r{r}" for r in range(batch)]
    budgets = np.full(batch, k)

    def sweep(n: int) -> list[float]:
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            d.propose_batch(ids, budgets)
            lat.append(time.perf_counter() - t0)
        return lat

    quiet = sweep(rounds)
    ps2, cs2 = wl.step(problems, 16, max(1, push_tokens // (problems * 16)) * 5 // 4)
    d.add_rollouts(ps2, cs2, background=True)
    busy = []
    while d.stats()["pending_updates"]:
        busy += sweep(1)
    d.wait_for_updates()
    q = lambda xs, p: float(np.percentile(xs, p)) * 1e3 if xs else float("nan")  # noqa: E731
    out.update(quiet_p50_ms=q(quiet, 50), quiet_p99_ms=q(quiet, 99), busy_p50_ms=q(busy, 50),
               busy_p99_ms=q(busy, 99), busy_steps=len(busy), stall_batch=batch)
    return out


def _contexts(text: str) -> list[int]:
    """argparse ``type=`` of ``--context``: comma-separated ints >= :data:`PROMPT_TOKENS`."""
    try:
        values = positive_int_list(text)
    except argparse.ArgumentTypeError:
        values = [0]
    if min(values) < PROMPT_TOKENS:
        raise argparse.ArgumentTypeError(f"must be comma-separated ints >= {PROMPT_TOKENS} (the prompt's tokens "
                                         f"included), got {text!r}")
    return values


def _skips(text: str) -> set[tuple[int, int]]:
    """argparse ``type=`` of ``--skip``: comma-separated ``BATCHxCONTEXT`` items (``''``: none), as a set of pairs."""
    out = set()
    for item in text.split(",") if text else ():
        m = re.fullmatch(r"\s*(\d+)x(\d+)\s*", item)
        if not m:
            raise argparse.ArgumentTypeError(f"must be comma-separated BATCHxCONTEXT items, e.g. 1024x16384, got "
                                             f"{text!r}")
        out.add((int(m.group(1)), int(m.group(2))))
    return out


def _forward_ms(text: str) -> float:
    """argparse ``type=`` of ``--forward-ms``: a number in [0, 60000] (nan rejected)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 60_000.0:
        raise argparse.ArgumentTypeError(f"must be a number of ms in [0, 60000], got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (``das-trl bench drafter-speed``); prints figures, returns 0 (argparse exits 2, naming the
    option, on a bad value before anything runs)."""
    ap = argparse.ArgumentParser(prog="das-trl bench drafter-speed", description=__doc__.splitlines()[0])
    ap.add_argument("--compare", default="suffix", choices=("suffix", "none"),
                    help="baseline proposer: 'suffix' (vLLM's) or 'none' (default %(default)s)")
    ap.add_argument("--batch", type=positive_int_list, default="256,1024",
                    help="running requests per engine step, comma-separated, each >= 1 (default %(default)s)")
    ap.add_argument("--context", type=_contexts, default="1024,16384",
                    help=f"tokens per request before timing (its {PROMPT_TOKENS}-token prompt included), "
                         f"comma-separated, each >= {PROMPT_TOKENS} (default %(default)s)")
    ap.add_argument("--rounds", type=positive_int, default=20,
                    help="timed engine steps per configuration, >= 1 (default %(default)s)")
    ap.add_argument("--samples", type=positive_int, default=8,
                    help="history rollouts per problem per appearance, >= 1 (default %(default)s)")
    ap.add_argument("--appearances", type=positive_int, default=2,
                    help="history steps pushed before timing, >= 1 (default %(default)s)")
    ap.add_argument("--history-tokens", type=non_negative_int, default=2_000_000,
                    help="cap of the history pushed first, >= 0 (rollouts are at least 64 tokens whatever the cap; "
                         "default %(default)s)")
    ap.add_argument("--push-tokens", type=non_negative_int, default=4_000_000,
                    help="size of the timed push, >= 0 (0: skip; default %(default)s)")
    ap.add_argument("--k", type=int_in_range(1, MAX_CAP), default=16,
                    help=f"DAS num_speculative_tokens, in [1, {MAX_CAP}] (the native core's cap; default "
                         f"%(default)s)")
    ap.add_argument("--backend", default="native", choices=("native", "python"),
                    help="the DAS drafter's backend (default %(default)s)")
    ap.add_argument("--vocab", type=int_in_range(2, _MAX_VOCAB), default=32000,
                    help=f"token ids of the synthetic workload, in [2, {_MAX_VOCAB}] (default %(default)s)")
    ap.add_argument("--seed", type=non_negative_int, default=0, help="workload seed, >= 0 (default %(default)s)")
    ap.add_argument("--skip", type=_skips, default="",
                    help="configurations to skip, comma-separated BATCHxCONTEXT items, e.g. '1024x16384' "
                         "(default: none)")
    ap.add_argument("--workload", default="drafting", choices=("drafting", "silent"),
                    help="'drafting': outputs close to the history (most rows draft); 'silent': random outputs, "
                         "nothing pays, the plan stops drafting (what a step costs when nothing pays; default "
                         "%(default)s)")
    ap.add_argument("--warmup-rounds", type=non_negative_int, default=5,
                    help="untimed engine steps before the timed ones, >= 0 (the plan learns the acceptance; default "
                         "%(default)s)")
    ap.add_argument("--forward-ms", type=_forward_ms, default=0.0,
                    help="emulated forward pass between engine steps (ms in [0, 60000], untimed; e.g. 7, the paper's "
                         "c_base): what the drafter's ingest thread does meanwhile leaves the proposer's time "
                         "(default %(default)s)")
    args = ap.parse_args(argv)
    kinds = ["das"] + ([args.compare] if args.compare == "suffix" else [])
    print(f"{'batch':>6}{'context':>9}  {'proposer':<8}{'us/req-round':>13}{'(cpu)':>8}{'tok/round':>10}"
          f"  {'of which drafter step':>22}{'controller (cpu)':>18}{'rows drafted':>14}{'silent steps':>14}")
    for batch in args.batch:
        for context in args.context:
            if (batch, context) in args.skip:
                continue
            problems = max(1, batch // 8)
            wl = Workload(problems, args.vocab, context + args.rounds * (args.k + 2) + 256, args.seed)
            hist_len = max(64, min(context, args.history_tokens // (problems * args.samples * args.appearances)))
            history = [wl.step(problems, args.samples, hist_len) for _ in range(args.appearances)]
            res = {}
            for kind in kinds:
                res[kind] = run_batch(kind, wl, history, batch, context, args.rounds, args.k, args.backend,
                                      args.workload, args.warmup_rounds, args.forward_ms)
                r = res[kind]
                inner = (f"  {r['drafter_us_wall']:>12.1f} ({r['drafter_us_cpu']:.1f} cpu){r['controller_us_cpu']:>18.2f}"
                         f"{100 * r['speculated_share']:>13.0f}%{r['silent_steps']:>8d} of {args.rounds}"
                         if kind == "das" else "")
                print(f"{batch:>6}{context:>9}  {kind:<8}{r['us_wall']:>13.1f}{r['us_cpu']:>8.1f}"
                      f"{r['tokens_per_round']:>10.3f}{inner}", flush=True)
            if "suffix" in res:
                print(f"{'':>17}DAS / suffix per request-round: {res['das']['us_wall'] / res['suffix']['us_wall']:.2f}x "
                      f"(cpu {res['das']['us_cpu'] / res['suffix']['us_cpu']:.2f}x); DAS history "
                      f"{res['das']['bytes_per_history_token']:.0f} B/token, live pool "
                      f"{res['das']['live_bytes'] / 2**20:.0f} MiB", flush=True)
    if args.push_tokens:
        wl = Workload(512, args.vocab, 700, args.seed + 1)
        p = push_and_stall(wl, 256, args.push_tokens, args.k, args.backend, args.rounds)
        print(f"push: {p['push_tokens'] / 1e6:.2f} M tokens in {p['push_seconds']:.2f} s wall "
              f"({p['push_us_per_token']:.3f} us/token; add_rollouts returned after {p['push_returns_after_s']:.2f} s, "
              f"the GIL was free {100 * p['gil_free_share']:.0f}% of the push); history "
              f"{p['bytes_per_history_token']:.0f} B/token")
        print(f"stall (batch {p['stall_batch']}, one propose_batch per engine step): p50 {p['quiet_p50_ms']:.2f} / "
              f"p99 {p['quiet_p99_ms']:.2f} ms quiet; p50 {p['busy_p50_ms']:.2f} / p99 {p['busy_p99_ms']:.2f} ms "
              f"during a background push ({p['busy_steps']} steps); p99 ratio "
              f"{p['busy_p99_ms'] / p['quiet_p99_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

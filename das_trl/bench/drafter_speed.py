"""Micro-benchmark of the DAS drafter's CPU costs (prints figures; not a test).

Synthetic history: ``--problems`` problems x ``--samples`` siblings x ``--appearances``
GRPO steps of ~``--length``-token completions. Each problem has a template; a sibling is
the template with ~10% of tokens resampled and spans shuffled (repetitive structure,
like chains of thought of one problem), plus phrases shared across problems.

Measures: time of each ``add_rollouts`` (one step: problems x samples completions),
then ``--batch`` live requests decoding a fresh sibling: time per ``extend_request`` and
per ``propose`` call, and the simulated tokens per verification round (accepted + 1).
Finally the stall: one more step is pushed with ``background=True`` while the batch keeps
proposing; it prints the propose latency (p50 / p99 / max) during that update next to the
latency without one, and the blocking time of the same push done synchronously (what the
engine would wait if the update ran on its critical path).

    python -m das_trl.bench.drafter_speed [--problems 512 --samples 16 --appearances 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from das_trl.drafter import DASDrafter, DrafterConfig


def _sibling(rng: np.random.Generator, template: np.ndarray, phrases: np.ndarray, vocab: int) -> np.ndarray:
    out = template.copy()
    mask = rng.random(len(out)) < 0.10
    out[mask] = rng.integers(0, vocab, int(mask.sum()))
    # Splice a few cross-problem phrases in (global-tree material).
    for _ in range(3):
        p = phrases[rng.integers(len(phrases))]
        at = rng.integers(0, len(out) - len(p))
        out[at:at + len(p)] = p
    return out[:int(rng.integers(len(out) * 6 // 10, len(out) + 1))]  # ragged lengths


def _measure_stall(drafter: DASDrafter, args, rng, prompts, templates, phrases, which, truths) -> None:
    """Propose latency with and without a background history update in flight (prints figures)."""
    ps, cs = [], []
    for i in range(args.problems):
        for _ in range(args.samples):
            ps.append(prompts[i])
            cs.append(_sibling(rng, templates[i], phrases, args.vocab))
    ctxs = [np.concatenate([prompts[i], truths[r][:32]])[-64:] for r, i in enumerate(which)]

    def sweep() -> list[float]:
        lat = []
        for r in range(len(which)):
            t0 = time.perf_counter()
            drafter.propose(f"r{r}", ctxs[r], 16)
            lat.append(time.perf_counter() - t0)
        return lat

    quiet = sweep() + sweep()
    t0 = time.perf_counter()
    drafter.add_rollouts(ps, cs, background=True)
    busy = []
    while drafter.stats()["pending_updates"]:
        busy += sweep()
    drafter.wait_for_updates()
    bg_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    drafter.add_rollouts(ps, cs)  # the same step again, synchronously: the blocking alternative
    sync_seconds = time.perf_counter() - t0
    q = lambda xs, p: float(np.percentile(xs, p)) * 1e3  # noqa: E731
    print(f"stall: propose latency without an update p50 {q(quiet, 50):.3f} / p99 {q(quiet, 99):.3f} / max "
          f"{max(quiet) * 1e3:.2f} ms; during a background update of {sum(len(c) for c in cs) / 1e6:.2f} M tokens "
          f"({bg_seconds:.2f} s, {len(busy)} proposals served) p50 {q(busy, 50):.3f} / p99 {q(busy, 99):.3f} / max "
          f"{max(busy, default=0) * 1e3:.2f} ms; the same push done synchronously blocks {sync_seconds:.2f} s")


def main(argv: list[str] | None = None) -> int:
    """Run the micro-benchmark (``das-trl bench drafter-speed``); prints figures, returns 0."""
    ap = argparse.ArgumentParser(prog="das-trl bench drafter-speed", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=512)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--appearances", type=int, default=4)
    ap.add_argument("--length", type=int, default=500)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    prompts = [rng.integers(0, args.vocab, 64).astype(np.int32) for _ in range(args.problems)]
    templates = [rng.integers(0, args.vocab, args.length).astype(np.int32) for _ in range(args.problems)]
    phrases = rng.integers(0, args.vocab, (64, 24)).astype(np.int32)

    drafter = DASDrafter(DrafterConfig())
    print(f"config: {drafter.config}")
    for step in range(args.appearances):
        ps, cs = [], []
        for i in range(args.problems):
            for _ in range(args.samples):
                ps.append(prompts[i])
                cs.append(_sibling(rng, templates[i], phrases, args.vocab))
        ntok = sum(len(c) for c in cs)
        t0 = time.perf_counter()
        out = drafter.add_rollouts(ps, cs)
        dt = time.perf_counter() - t0
        print(f"add_rollouts step {step}: {ntok / 1e6:.2f} M tokens, {len(cs)} seqs: {dt:.2f} s "
              f"({dt / ntok * 1e6:.2f} us/token) -> {out}")

    # Live batch: each request decodes a fresh sibling of a random problem.
    which = rng.integers(0, args.problems, args.batch)
    truths = [_sibling(rng, templates[i], phrases, args.vocab) for i in which]
    pos = np.zeros(args.batch, dtype=np.int64)
    for r, i in enumerate(which):
        drafter.start_request(f"r{r}", prompts[i])
    t_prop = t_ext = 0.0
    n_prop = n_ext = rounds_tokens = n_rounds = 0
    for _ in range(args.rounds):
        for r, i in enumerate(which):
            truth = truths[r]
            if pos[r] >= len(truth):
                continue
            ctx = np.concatenate([prompts[i], truth[:pos[r]]])[-64:]
            t0 = time.perf_counter()
            draft = drafter.propose(f"r{r}", ctx, 16)
            t_prop += time.perf_counter() - t0
            n_prop += 1
            # Verification: accept the matching prefix, plus one bonus token.
            nxt = truth[pos[r]:pos[r] + len(draft)].tolist()
            acc = 0
            while acc < len(draft) and acc < len(nxt) and draft[acc] == nxt[acc]:
                acc += 1
            step_tokens = truth[pos[r]:pos[r] + acc + 1]
            t0 = time.perf_counter()
            drafter.extend_request(f"r{r}", step_tokens)
            t_ext += time.perf_counter() - t0
            n_ext += 1
            pos[r] += len(step_tokens)
            rounds_tokens += len(step_tokens)
            n_rounds += 1
    st = drafter.stats()
    _measure_stall(drafter, args, rng, prompts, templates, phrases, which, truths)
    print(f"propose: {t_prop / n_prop * 1e6:.1f} us/call over {n_prop} calls "
          f"(batch {args.batch}: {t_prop / n_prop * args.batch * 1e3:.1f} ms per engine step)")
    print(f"extend_request: {t_ext / n_ext * 1e6:.1f} us/call")
    print(f"simulated tokens per round (accepted + 1): {rounds_tokens / n_rounds:.2f}")
    print(f"wins: {st['wins']}; drafts {st['drafts']}/{st['proposals']}, "
          f"draft tokens {st['draft_tokens']}")
    print(f"history: {st['tokens'] / 1e6:.2f} M tokens, {st['appearances']} appearances, "
          f"{st['problem_trees']} problem trees, support table {st['support_table_bytes'] / 2**20:.0f} MiB")
    try:
        import resource
        print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A seeded engine-like simulation that drives two drafters with identical inputs (tests of the native core)."""

from __future__ import annotations

import numpy as np


def simulate_pair(a, b, seed: int, vocab: int = 30, n_problems: int = 3, samples: int = 4, steps: int = 3,
                  out_len: int = 60, use_step: bool = True, on_round=None) -> tuple[int, int]:
    """Run ``steps`` GRPO-like steps through drafters ``a`` and ``b``; every round both draft the same rows with the
    same budgets, verification is simulated against a target completion, trims and partial verifications are
    random. Returns ``(mismatching rows, rows)``; ``on_round(batch_a, batch_b, ids)`` sees every round."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1000, 1000 + 3 * vocab, int(rng.integers(5, 50))).tolist() for _ in range(n_problems)]
    bases = [rng.integers(1000, 1000 + vocab, out_len).tolist() for _ in range(n_problems)]

    def sample(p: int) -> list[int]:
        seq = list(bases[p])
        for _ in range(int(rng.integers(0, 8))):
            seq[int(rng.integers(0, len(seq)))] = int(rng.integers(1000, 1000 + vocab))
        return seq[: int(rng.integers(out_len // 3, out_len + 1))]

    mismatches = rows_seen = 0
    width = 64 + out_len + 20
    for step in range(steps):
        rids, targets, problem_of = [], [], []
        for p in range(n_problems):
            for s in range(samples):
                rids.append(f"s{step}-p{p}-{s}")
                targets.append(sample(p))
                problem_of.append(p)
        matrix = np.zeros((len(rids), width), np.int32)
        num_tokens = np.zeros(len(rids), np.int64)
        num_prompt = np.zeros(len(rids), np.int64)
        for i, rid in enumerate(rids):
            pr = prompts[problem_of[i]]
            matrix[i, :len(pr)] = pr
            num_tokens[i] = num_prompt[i] = len(pr)
            for d in (a, b):
                d.start_request(rid, pr)
        pos = [0] * len(rids)
        sampled = np.ones(len(rids), np.int64)
        verified = np.full(len(rids), -1, np.int64)
        running = list(range(len(rids)))
        while running:
            ids = [rids[i] for i in running]
            budgets = rng.integers(-1, 18, len(running))
            if use_step:
                r = np.asarray(running)
                args = (matrix, r, num_tokens[r], num_prompt[r], sampled[r], verified[r], budgets)
                ba, bb = a.step(ids, *args), b.step(ids, *args)
            else:
                ba, bb = a.propose_batch(ids, budgets), b.propose_batch(ids, budgets)
            rows_seen += len(ids)
            for j in range(len(ids)):
                if not (ba.row(j) == bb.row(j) and ba.source[j] == bb.source[j]
                        and ba.match_len[j] == bb.match_len[j] and np.array_equal(ba.accept[j], bb.accept[j])):
                    mismatches += 1
            if on_round is not None:
                on_round(ba, bb, ids)
            sent = np.minimum(bb.lengths, rng.integers(0, 17, len(ids))) if rng.random() < 0.3 else bb.lengths
            if use_step:
                for d in (a, b):
                    d.trim(ids, sent)
            still = []
            for j, i in enumerate(running):
                draft = bb.row(j)[: int(sent[j])]
                t, p = targets[i], pos[i]
                usable = min(len(draft), len(t) - p - 1)
                acc = 0
                while acc < usable and draft[acc] == t[p + acc]:
                    acc += 1
                emit = t[p:p + acc + 1]
                part = int(rng.integers(0, len(draft) + 1)) if (draft and rng.random() < 0.2) else -1
                if use_step:
                    verified[i] = part
                    sampled[i] = len(emit)
                    matrix[i, num_tokens[i]:num_tokens[i] + len(emit)] = emit
                    num_tokens[i] += len(emit)
                else:
                    for d in (a, b):
                        d.record_acceptance(rids[i], min(acc, part) if part >= 0 else acc,
                                            None if part < 0 else part)
                        d.extend_request(rids[i], emit)
                pos[i] += len(emit)
                if pos[i] >= len(t):
                    for d in (a, b):
                        d.stop_request(rids[i])
                else:
                    still.append(i)
            running = still
        for d in (a, b):
            d.add_rollouts([prompts[p] for p in problem_of], targets)
    return mismatches, rows_seen

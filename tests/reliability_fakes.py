"""Fakes for the fast reliability tests: a DAS worker (the real DASWorkerExtension + DASProposer + DASDrafter) without
vLLM, an engine client over such workers, and a model runner that feeds the proposer batch rows like vLLM does."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from das_trl.vllm.client import DASEngine, DASEngineError
from das_trl.vllm.proposer import DASProposer
from das_trl.vllm.worker_extension import DASWorkerExtension

VOCAB = 1000
MAX_MODEL_LEN = 256
K = 8


class FakeRunner:
    """What DASProposer reads from vLLM's model runner: ``input_batch`` (req_ids, num_prompt_tokens), ``requests``."""

    def __init__(self, proposer: DASProposer | None):
        self.drafter = proposer
        self.input_batch = SimpleNamespace(req_ids=[], num_prompt_tokens=np.zeros(64, np.int32))
        self.requests: dict = {}
        self.token_ids = np.zeros((64, MAX_MODEL_LEN), np.int32)
        self.num_tokens = np.zeros(64, np.int32)

    def set_rows(self, rows: list[tuple[str, list[int], list[int]]], extra_args: dict | None = None) -> None:
        """rows: (req_id, prompt, output so far). Fills the batch as vLLM's input batch would."""
        self.input_batch.req_ids = [r[0] for r in rows]
        for i, (req_id, prompt, output) in enumerate(rows):
            seq = list(prompt) + list(output)
            self.token_ids[i, : len(seq)] = seq
            self.num_tokens[i] = len(seq)
            self.input_batch.num_prompt_tokens[i] = len(prompt)
            self.requests[req_id] = SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra_args))

    def step(self, sampled: list[list[int]]) -> list[list[int]]:
        """One proposer round: ``sampled[i]`` are the tokens row i just got (already in ``token_ids``)."""
        return self.drafter.propose(sampled, self.num_tokens.copy(), self.token_ids)


class FakeWorker(DASWorkerExtension):
    """A vLLM worker as the extension sees it. ``das=False``: a worker without the DAS proposer; ``runner=False``: a
    worker before its model runner exists."""

    def __init__(self, das: bool = True, runner: bool = True, vocab: int = VOCAB):
        config = SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens=K),
            model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN, get_vocab_size=lambda: vocab),
        )
        self.vllm_config = config
        if runner:
            self.model_runner = FakeRunner(DASProposer(config) if das else None)

    @property
    def proposer(self) -> DASProposer:
        return self.model_runner.drafter


class FakeEngine(DASEngine):
    """An engine client over FakeWorkers (one per data-parallel/tensor-parallel worker). ``fail`` makes the next
    ``fail`` calls of the named methods raise like an unreachable server."""

    def __init__(self, workers: list[FakeWorker], name: str = "fake engine"):
        self.workers = workers
        self.name = name
        self.fail: dict[str, int] = {}
        self.calls: list[str] = []

    def rpc(self, method: str, *args: str, timeout: float | None = None) -> list:
        self.calls.append(method)
        if self.fail.get(method, 0) > 0:
            self.fail[method] -= 1
            raise DASEngineError(f"{self.name} cannot be reached (ConnectionError)")
        return [getattr(w, method)(*args) for w in self.workers]


def push_long_and_short_history(worker: FakeWorker, rng) -> tuple[list[list[int]], list[list[int]]]:
    """Push a history of 5 problems into ``worker``'s proposer: problem 0 is long (200-token completions), problems
    1-4 stop after 40 tokens; 4 identical samples each. Returns ``(prompts, texts)`` (texts: 200 tokens each)."""
    prompts = [rng.integers(10, 900, 12).tolist() for _ in range(5)]
    texts = [rng.integers(10, 900, 200).tolist() for _ in range(5)]
    ps, cs = [], []
    for i, (p, t) in enumerate(zip(prompts, texts)):
        for _ in range(4):
            ps.append(p)
            cs.append(t if i == 0 else t[:40])
    worker.proposer.add_history(ps, cs, background=False)
    return prompts, texts


def run_round(worker: FakeWorker, prompts, texts, rows: list[tuple[str, int, int]]) -> list[list[int]]:
    """One proposer round for requests ``(req_id, problem index, output length so far)``: returns their drafts."""
    runner = worker.model_runner
    runner.set_rows([(rid, prompts[i], texts[i][:n]) for rid, i, n in rows])
    return runner.step([[texts[i][n - 1]] for _, i, n in rows])

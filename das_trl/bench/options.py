"""Parsing and checking of the bench commands' structured options (JSON config overrides, ``--ngram``, epoch lists)
and the proposer-CPU and engine options ``bench replay`` and ``bench suite`` share (:func:`add_cpu_args`,
:func:`add_engine_args`).

Errors are ``ValueError`` (the ``das-trl bench`` command prints them as one line with exit code 2) or, for the
``type=`` functions, ``argparse.ArgumentTypeError`` (argparse's own usage error, exit code 2 as well).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Sequence


def json_overrides(text: str | None, option: str, config: type) -> dict:
    """The JSON object ``text`` given as ``option``: overrides of the dataclass ``config``'s fields (``{}`` for none).

    Raises:
        ValueError: ``text`` is not JSON, not a JSON object, or has a key that is not a field of ``config`` (the
            message names the unknown keys and lists the valid ones).
    """
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option} is not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{option} must be a JSON object of {config.__name__} fields, e.g. '{{\"name\": value}}', "
                         f"got {type(value).__name__}: {text!r}")
    fields = [f.name for f in dataclasses.fields(config)]
    unknown = [k for k in value if k not in fields]
    if unknown:
        raise ValueError(f"{option}: unknown {config.__name__} field{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))}; valid fields: {', '.join(fields)}")
    return value


def drafter_names(text: str, known: Sequence[str]) -> list[str]:
    """``--drafters`` as a list of names: comma-separated, blanks ignored, each once and among ``known``.

    Raises:
        ValueError: no name given, a name listed twice, or an unknown name (the message names them and lists
            ``known``).
    """
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise ValueError(f"--drafters: no drafter given (got {text!r}); choose from {', '.join(known)}")
    unknown = [x for x in names if x not in known]
    if unknown:
        raise ValueError(f"--drafters: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:
        raise ValueError(f"--drafters: {', '.join(map(repr, twice))} listed more than once")
    return names


def ngram_spec(text: str) -> tuple[int, int, int]:
    """``--ngram`` as ``(prompt_lookup_min, prompt_lookup_max, num_speculative_tokens)``.

    Raises:
        argparse.ArgumentTypeError: not three comma-separated ints with ``1 <= min <= max`` and ``k >= 1``.
    """
    parts = text.split(",")
    try:
        lo, hi, k = (int(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be MIN,MAX,K (three ints: prompt_lookup_min, prompt_lookup_max, "
                                         f"num_speculative_tokens), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"needs 1 <= prompt_lookup_min <= prompt_lookup_max, got {text!r}")
    if k < 1:
        raise argparse.ArgumentTypeError(f"num_speculative_tokens must be >= 1, got {text!r}")
    return lo, hi, k


def epoch_list(text: str) -> list[int]:
    """A comma-separated list of distinct epoch indices (``--train-epochs``), in the order given.

    Raises:
        argparse.ArgumentTypeError: an entry is not an int >= 0, or an epoch is listed twice.
    """
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated epoch indices, e.g. 0,1,2, got {text!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"must be comma-separated epoch indices >= 0, got {text!r}")
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"lists an epoch twice: {text!r}")
    return out


#: A public measurement of what vLLM's async scheduling saves per engine step, to report beside the default 0
#: (docs/benchmarks.md, "What the engine waits for"): vLLM PR #25872 (EAGLE3 + async scheduling, Llama-3.1-8B on
#: an L20, concurrency 1): mean inter-token latency 28.14 -> 27.17 ms, i.e. about 1 ms per engine step.
ASYNC_OFF_MS_REFERENCE = 1.0


def add_cpu_args(p: argparse.ArgumentParser) -> None:
    """The knobs of the proposer's CPU in the time with the CPU (shared by ``bench replay`` and ``bench suite``)."""
    g = p.add_argument_group("proposer CPU (the time with the CPU: c_base * steps + c_tok * verified tokens + "
                             "c_logprob * logprob rows + proposer CPU / host speed + async-off charge)")
    g.add_argument("--host-speed", type=positive_float, default=1.0,
                   help="how much faster the target host's CPU runs the proposer than this machine: the measured "
                        "CPU time is divided by it (1 = this machine; default %(default)s)")
    g.add_argument("--draft-threads", type=_threads, default=None,
                   help="run the DAS drafter with this many drafting threads (DrafterConfig.draft_threads; default "
                        "1) and, when > 1, time its calls by the wall clock (thread CPU time would miss the workers)")
    g.add_argument("--async-off-ms", type=non_negative_float, default=0.0,
                   help="ms charged per engine step to every speculative method (not none): vLLM runs a custom "
                        "drafter with async scheduling off (default %(default)s; a public vLLM measurement puts the "
                        f"saving near {ASYNC_OFF_MS_REFERENCE:g} ms per step: PR #25872, see docs/benchmarks.md)")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (``--host-speed``, the cost model's ``--c-base`` / ``--c-tok``), checked
    as the options are parsed, before anything is loaded.

    Raises:
        argparse.ArgumentTypeError: not a number, or not finite and > 0 (nan included).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def int_or_never(text: str) -> int:
    """argparse type: an int >= 0, or -1 for "never" (the suite's ``--early-appearance``), checked as the options are
    parsed.

    Raises:
        argparse.ArgumentTypeError: not an int, or below -1.
    """
    try:
        value = int(text)
    except ValueError:
        value = -2
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be an int >= -1 (-1: never), got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """argparse ``type=``: a finite number >= 0 (``ArgumentTypeError`` naming the text otherwise, nan included)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 <= value < float("inf"):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _threads(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be an int in [1, 64], got {text}")
    return value


def add_engine_args(p: argparse.ArgumentParser, shapes: bool = False) -> None:
    """The engine's verification logprob price and admission (shared by ``bench replay`` and ``bench suite``;
    ``shapes``: the suite's ``--shapes`` list instead of one ``--verification-shape``)."""
    from das_trl.budget.cost_model import ASSUMED_C_LOGPROB_MS, VERIFICATION_SHAPES

    g = p.add_argument_group("the engine (verification logprobs, admission)")
    g.add_argument("--c-logprob", type=non_negative_float, default=ASSUMED_C_LOGPROB_MS,
                   help="cost model: ms per row of vLLM's verification logprob path (default %(default)s: an H200 "
                        "measured 0.00098 at a 151,936-entry vocabulary with vLLM's compiled rank count, "
                        "recipes/gpu/verification_cost.py, docs/budget.md; 0: free)")
    if shapes:
        # A string default (argparse runs it through the type) so --help shows it as typed, not as a list repr
        g.add_argument("--shapes", type=_shapes, default=",".join(VERIFICATION_SHAPES),
                       help="verification shapes, comma-separated: the first prices the main tables, the others add "
                            "none, suffix and the default priced (the default re-run) under them (default "
                            "%(default)s)")
    else:
        g.add_argument("--verification-shape", choices=VERIFICATION_SHAPES, default=VERIFICATION_SHAPES[0],
                       help="the engine's logprob path: 'patched' (das-trl's patch: one row per verified position) or "
                            "'padded' (vLLM's own: rows x (longest draft + 1)); the default drafter plans for it")
    g.add_argument("--admission", type=_admission, default=None,
                   help="requests enter under this token budget per step with their prompts' prefill (chunked, "
                        "waiting requests before drafts, as das-trl's scheduler): a number, or 'trainer' for the "
                        "budget a colocated GPU engine gets (rows x (K + 1) within 8192..16384); default: off (all "
                        "requests decode from step 0, prompts free)")
    g.add_argument("--max-num-seqs", type=positive_int, default=None,
                   help="with --admission: most requests in the engine at once (default: the whole batch)")
    g.add_argument("--verify-limit", type=_verify_limit, default=None,
                   help="the GPU engine's profiled verification shape: 'profile' (at most D = max(N, 8 x K) draft "
                        "tokens per step within max_num_batched_tokens, N = min(rows, max_num_batched_tokens); D / N "
                        "per row on the padded shape: a GPU engine's default) or a number (DAS_TRL_VERIFY_DRAFT_TOKENS); default: none (the CPU build's)")
    g.add_argument("--no-prefix-cache", action="store_true",
                   help="with --admission: every prompt is computed in full (default: a problem's later prompts hit "
                        "vLLM's prefix cache)")


def admission_for(args: argparse.Namespace, num_requests: int):
    """The :class:`~das_trl.bench.simulation.Admission` the parsed ``--admission`` options ask for, for a batch of
    ``num_requests`` (``None``: off).

    Raises:
        ValueError: ``--max-num-seqs`` above the token budget.
    """
    from das_trl.bench.simulation import Admission

    if args.admission is None:
        return None
    prefix = not args.no_prefix_cache
    if args.admission == "trainer":
        adm = Admission.trainer_default(num_requests, prefix_cache=prefix)
    else:
        adm = Admission(args.admission, min(num_requests, args.admission), prefix_cache=prefix)
    if args.max_num_seqs is not None:
        adm = Admission(adm.token_budget, args.max_num_seqs, prefix)
    return adm


def limits_for(args: argparse.Namespace, num_requests: int, shape: str):
    """The profiled verification limits ``--verify-limit`` asks for, for a batch of ``num_requests`` on the
    ``shape`` path (``None``: off): the engine's rows and token budget from ``--admission`` / ``--max-num-seqs``, else
    the batch and das-trl's GPU default budget
    (:func:`~das_trl.bench.simulation.profiled_limits`)."""
    from das_trl.bench.simulation import Admission

    if args.verify_limit is None:
        return None
    adm = admission_for(args, num_requests) or Admission.trainer_default(num_requests)
    if args.max_num_seqs is not None:
        adm = Admission(adm.token_budget, args.max_num_seqs)
    return adm.verification_limits(shape, None if args.verify_limit == "profile" else args.verify_limit)


def _verify_limit(text: str) -> int | str:
    return _word_or_count(text, "profile", "'profile' or a number of draft tokens per step (>= 1)")


def _word_or_count(text: str, word: str, what: str) -> int | str:
    """``word``, or an int >= 1 (``argparse.ArgumentTypeError`` naming ``what`` otherwise)."""
    if text.strip() == word:
        return word
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}") from None


def _shapes(text: str) -> list[str]:
    from das_trl.budget.cost_model import VERIFICATION_SHAPES

    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in VERIFICATION_SHAPES for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"comma-separated, each once, from {','.join(VERIFICATION_SHAPES)}; got "
                                         f"{text!r}")
    return values


def _admission(text: str) -> int | str:
    return _word_or_count(text, "trainer", "a token budget (an int >= 1) or 'trainer'")


def positive_int(text: str) -> int:
    """argparse ``type=``: an int >= 1 (``ArgumentTypeError`` naming the text otherwise, so argparse exits 2 with
    ``argument --NAME: must be an int >= 1, got ...``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def int_in_range(low: int, high: int):
    """An argparse ``type=`` accepting an int in ``[low, high]`` (``ArgumentTypeError`` otherwise: argparse exits 2
    with ``argument --NAME: must be an int in [low, high], got ...``)."""
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an int in [{low}, {high}], got {text!r}")
        return value
    return check


def non_negative_int(text: str) -> int:
    """argparse ``type=``: an int >= 0 (``ArgumentTypeError`` naming the text otherwise: exit 2 with ``argument
    --NAME: must be an int >= 0, got ...``)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}")
    return value


def positive_int_list(text: str) -> list[int]:
    """argparse ``type=``: comma-separated ints >= 1 (``64,256,1024``), as a ``list[int]``.

    Raises:
        argparse.ArgumentTypeError: an empty item, a non-int or an int < 1.
    """
    try:
        return [positive_int(x) for x in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be comma-separated ints >= 1, got {text!r}") from None


def output_file(text: str) -> str:
    """argparse ``type=`` of an output file option (``--json``, ``--out``): checked as the options are parsed, before
    anything runs, so that a path that cannot be written fails in a second, not after the run. Creates nothing (the
    write probe is an unnamed temporary file), and returns ``text`` unchanged; the writer creates missing folders.

    Checked: ``text`` is not empty and not an existing directory; an existing file is writable; otherwise the nearest
    existing folder above it is a folder this process can create files in (by ``os.access`` and by opening an unnamed
    temporary file there, which also catches what ``os.access`` does not: root in ``/proc``, a read-only mount).
    A disk removed during the run can still fail the write at the end.

    Raises:
        argparse.ArgumentTypeError: ``cannot write PATH (why)``, which argparse prints as ``argument --NAME: cannot
            write PATH (why)`` with exit code 2.
    """
    import os

    if not text:
        raise argparse.ArgumentTypeError("cannot write '' (give a file path)")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"cannot write {text} (it is a directory; give a file path)")
    if os.path.exists(text):
        if not os.access(text, os.W_OK):
            raise argparse.ArgumentTypeError(f"cannot write {text} (the file exists and is not writable)")
        return text
    _check_can_create(text, os.path.dirname(os.path.abspath(text)))
    return text


def output_dir(text: str) -> str:
    """argparse ``type=`` of an output folder option (``--plots``, ``--cache``): checked as the options are parsed,
    before anything runs. Creates nothing and returns ``text`` unchanged; the writer creates the folder.

    Checked: ``text`` is not empty; an existing path is a folder this process can create files in; otherwise the
    nearest existing folder above it is (the same checks as :func:`output_file`).

    Raises:
        argparse.ArgumentTypeError: ``cannot write PATH (why)`` (argparse: ``argument --NAME: ...``, exit code 2).
    """
    import os

    if not text:
        raise argparse.ArgumentTypeError("cannot write '' (give a folder path)")
    if os.path.lexists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"cannot write {text} (it exists and is not a folder)")
    _check_can_create(text, os.path.abspath(text))
    return text


def _check_can_create(text: str, folder: str) -> None:
    """``argparse.ArgumentTypeError`` naming ``text`` unless files can be created in ``folder`` or, where it does not
    exist yet, in the nearest existing folder above it (where the writer's ``mkdir(parents=True)`` starts)."""
    import os
    import tempfile

    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {text} ({folder} is not a folder)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text} (no permission to create files in {folder})")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {text} (cannot create files in {folder}: "
                                         f"{exc.strerror or exc})") from None

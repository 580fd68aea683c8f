"""The benchmarks page from the suite's JSON: the tables of ``docs/benchmarks.md``, the README's headline block and
the figures, all generated from what ``das-trl bench suite --json`` wrote
(:func:`das_trl.bench.report.write_suite_json`).

``das-trl bench page --json benchmarks/results/suite.json.gz`` rewrites every marked block
(``<!-- bench:NAME:start -->`` ... ``<!-- bench:NAME:end -->``) of ``docs/benchmarks.md``,
``benchmarks/realdata.md`` and ``README.md`` and writes the figures (:mod:`das_trl.bench.figures`) into ``docs/img/``; ``--check`` writes nothing and exits 1 when a block differs from
what the JSON gives. ``scripts/bench_page.sh`` runs the suite and then this. Optional keys are shown when present:
extra bounds (a ``ratios`` entry with ``"bound": true``) get a column, a point's ``reliability`` a section, ``host``
and ``das_trl_commit`` a line. The prose around the blocks describes the method; the numbers are all in the blocks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Callable, Sequence

from das_trl.bench.report import DEFAULT
from das_trl.bench.suite_json import (BY_SET_PNG, HEADLINE_PNG, RELIABILITY_PNG, bound_names,
                                     c_tok_key, c_tok_keys, load, ratio, reliability_points, variant_names,
                                     variant_ratio, variant_result)

_BLOCK = re.compile(r"(<!-- bench:([a-z0-9-]+):start -->\n)(.*?)(<!-- bench:\2:end -->)", re.S)


# ---------------------------------------------------------------------------- formatting
def _num(v: float, digits: int = 2) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _int(v) -> str:
    return f"{int(v):,}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] | None = None) -> str:
    align = align or ["---"] + ["---:"] * (len(head) - 1)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _c(c: str) -> str:
    return f"{float(c):g}"


# ---------------------------------------------------------------------------- the blocks
def settings_block(payload: dict) -> str:
    """One paragraph: the cost model, the CPU charge and the drafters' settings the JSON was written with."""
    cs = ", ".join(_c(c) for c in c_tok_keys(payload))
    c_base = payload.get("c_base_ms", math.nan)
    parts = [f"Cost model: `c_base` {_num(c_base, 1)} ms per engine step, `c_tok` {cs} ms per verified token "
             f"(tables and figures at c_tok {_c(c_tok_key(payload))} unless a column says otherwise); the drafter's "
             f"CPU divided by a host speed of {payload.get('host_speed', 1.0):g}, plus "
             f"{payload.get('async_off_ms', 0.0):g} ms per step for every speculative method (async scheduling "
             f"off)."]
    ks = sorted({p["bounds"]["k"] for p in payload["points"] if isinstance(p.get("bounds"), dict)
                 and isinstance(p["bounds"].get("k"), int)})
    if ks:
        parts.append(f"`oracle-text` draft cap: {', '.join(map(str, ks))} tokens.")
    ov = {k: payload.get(k) for k in ("das_config_overrides", "controller_overrides") if payload.get(k)}
    parts.append("Drafters at their defaults" + (f" except {json.dumps(ov, sort_keys=True)}" if ov else "")
                 + f", {payload.get('draft_threads', 1)} drafting thread(s).")
    host = payload.get("host")
    if isinstance(host, dict) and host:
        parts.append("CPU times measured on: " + ", ".join(f"{k} {v}" for k, v in host.items()) + ".")
    if payload.get("das_trl_commit"):
        parts.append(f"Code: das-trl at `{payload['das_trl_commit']}`.")
    return " ".join(parts)


def main_table(payload: dict, c: str | None = None, default: str = DEFAULT) -> str:
    """Per replay point at one cost model: none's time, suffix and the default with their CPU vs none, the default
    vs the better of none and suffix, its tokens per round and CPU per step, and every bound vs none."""
    c = c or c_tok_key(payload)
    bounds = bound_names(payload, c)
    head = ["set", "requests", "`none` (ms)", "`suffix` / none", "default / none", "default / best",
            "default tok/round", "default CPU ms/step"] + [f"`{b}` / none" for b in bounds]
    rows = []
    for p in payload["points"]:
        rows.append([f"`{p['name']}`", _int(p.get("requests")), _int(round(ratio(p, c, "none", "time_cpu_ms")))
                     if math.isfinite(ratio(p, c, "none", "time_cpu_ms")) else "-",
                     _num(ratio(p, c, "suffix", "time_cpu_vs_none")),
                     f"**{_num(ratio(p, c, default, 'time_cpu_vs_none'))}**",
                     _num(ratio(p, c, default, "time_cpu_vs_best")),
                     _num(ratio(p, c, default, "tokens_per_round")),
                     _num(ratio(p, c, default, "cpu_ms_per_step"), 3)]
                    + [_num(ratio(p, c, b, "time_cpu_vs_none")) for b in bounds])
    return _table(head, rows)


def cost_table(payload: dict, default: str = DEFAULT) -> str:
    """Per replay point, at every cost model: the default's and suffix's time with their CPU vs none."""
    cs = c_tok_keys(payload)
    head = ["set"] + [f"default / none @{_c(c)}" for c in cs] + [f"`suffix` / none @{_c(c)}" for c in cs]
    rows = [[f"`{p['name']}`"] + [_num(ratio(p, c, default, "time_cpu_vs_none")) for c in cs]
            + [_num(ratio(p, c, "suffix", "time_cpu_vs_none")) for c in cs] for p in payload["points"]]
    return _table(head, rows)


def engine_table(payload: dict, default: str = DEFAULT) -> str:
    """Per replay point at the reference cost model, the default (and ``suffix``) vs none under every engine variant
    of the suite: another verification shape (vLLM's padded logprob path: the default's steps whose longest draft it
    cut for the padding, and steps whose padding cost more than the kept drafts' expected saving) and admission (the
    requests' prompts prefilled under the engine's token budget: mean steps to each request's first token, none and
    the default), beside the main tables' figures."""
    c = c_tok_key(payload)
    variants = variant_names(payload)
    if not variants:
        return ("_The suite JSON has no other engine: `das-trl bench suite --shapes patched,padded --admission "
                "trainer` writes one._")
    main = payload.get("verification_shapes", ["patched"])[0]
    head = ["set", "requests", f"default / none ({main})"]
    for v in variants:
        if v == "admission":
            head += ["default / none (admission)", "first token, steps: none / default"]
        else:
            head += [f"default / none ({v})", f"`suffix` / none ({v})", f"default: steps cut for padding ({v})",
                     f"default: padding > saving ({v})"]
    rows = []
    for p in payload["points"]:
        row = [f"`{p['name']}`", _int(p.get("requests")), _num(ratio(p, c, default, "time_cpu_vs_none"))]
        for v in variants:
            if v == "admission":
                none_r, dflt = variant_result(p, v, c, "none"), variant_result(p, v, c, default)
                ttft = [r.get("first_token_steps_mean") for r in (none_r, dflt)]
                row += [_num(variant_ratio(p, v, c, default, "time_cpu_vs_none")),
                        " / ".join(_num(t, 1) if isinstance(t, (int, float)) else "-" for t in ttft)]
            else:
                counters = variant_result(p, v, c, default).get("counters", {})
                row += [_num(variant_ratio(p, v, c, default, "time_cpu_vs_none")),
                        _num(variant_ratio(p, v, c, "suffix", "time_cpu_vs_none")),
                        _int(counters.get("budget_padding_cut_steps")),
                        _int(counters.get("budget_padding_over_saving_steps"))]
        rows.append(row)
    return _table(head, rows)


def sets_table(payload: dict) -> str:
    """Per replay point: its file, the appearance replayed (the earlier ones are its history), requests, problems and
    completion tokens."""
    head = ["set", "file", "replayed appearance (from 0)", "requests", "problems", "completion tokens"]
    rows = [[f"`{p['name']}`", f"`{Path(str(p.get('path', ''))).name}`", _int(p.get("eval_epoch")),
             _int(p.get("requests")), _int(p.get("problems")), _int(p.get("tokens"))] for p in payload["points"]]
    return _table(head, rows, ["---", "---"] + ["---:"] * 4)


def _cells(x) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, float):
        return _num(x, 3)
    if isinstance(x, int):
        return _int(x)
    if isinstance(x, (list, tuple)):
        return ", ".join(_cells(v) for v in x)
    return str(x)


def _dict_rows_table(rows: list[dict]) -> str:
    head: list[str] = []
    for r in rows:
        head += [k for k in r if k not in head]
    return _table(head, [[_cells(r.get(k)) for k in head] for r in rows], ["---"] * len(head))


def _any_table(x) -> str:
    """A table of whatever shape the reliability data has: a list of rows, a dict of lists of rows, a dict of
    scalars."""
    if isinstance(x, list) and all(isinstance(r, dict) for r in x) and x:
        return _dict_rows_table(x)
    if isinstance(x, dict) and x and all(isinstance(v, list) for v in x.values()):
        return "\n\n".join(f"`{k}`:\n\n{_any_table(v)}" for k, v in x.items())
    if isinstance(x, dict) and x:
        if all(isinstance(v, dict) for v in x.values()):
            return _dict_rows_table([dict({"": k}, **v) for k, v in x.items()])
        return _dict_rows_table([x])
    return f"`{json.dumps(x)}`"


def _bucket_cell(b: dict) -> str:
    if not b.get("tokens"):
        return "-"
    return f"{_num(b.get('predicted'))} / {_num(b.get('realised'))} ({_int(b['tokens'])})"


def reliability_block(payload: dict, default: str = DEFAULT) -> str:
    """Predicted vs realised acceptance of the default's sent draft tokens per position bucket, one row per replay
    point at the reference cost model (summaries with ``buckets``: :mod:`das_trl.bench.reliability`); any other
    shape is shown as it is; a line when the JSON has none."""
    found = reliability_points(payload, default)
    if not found:
        return "_This suite JSON carries no reliability data._"
    if all(isinstance(rel, dict) and isinstance(rel.get("buckets"), list) for _, rel in found):
        labels: list[str] = []
        for _, rel in found:
            labels += [str(b.get("positions")) for b in rel["buckets"] if str(b.get("positions")) not in labels]
        rows = []
        for name, rel in found:
            by = {str(b.get("positions")): b for b in rel["buckets"]}
            rows.append([f"`{name}`"] + [_bucket_cell(by[k]) if k in by else "-" for k in labels])
        return _table(["set"] + [f"positions {k}" for k in labels], rows)
    return "\n\n".join(f"**`{name}`**\n\n{_any_table(rel)}" for name, rel in found)


#: What each recorded set is, by file stem, for the headline's table (``name@N``: the same file replayed at an earlier
#: appearance N). A stem not listed here shows as ``-``.
SET_WHAT = {
    "frozen_smollm2_t06": "SmolLM2-135M, frozen policy, T 0.6",
    "frozen_smollm2_t10": "SmolLM2-135M, frozen policy, T 1.0",
    "grpo_smollm2_products": "the main job's GRPO task run for 80 steps (SmolLM2-135M)",
    "qwen25_05b_gsm8k_grpo_das": "Qwen2.5-0.5B GRPO on GSM8K (third party)",
    "qwen25math7b_amc23_base_vs_grpo20": "Qwen2.5-Math-7B on AMC23 after 20 GRPO steps, the base model's rollouts as "
                                         "history (third party)",
    "r1distill_aime_p0019": "DeepSeek-R1-Distill-Qwen, one AIME problem, ~14k-token chains of thought (third party)",
}


def set_what(point: dict) -> str:
    """The headline table's description of a replay point and the appearance replayed (``name@N``: an early one,
    else the set's last); ``-`` for a set :data:`SET_WHAT` does not know."""
    stem, _, early = str(point["name"]).partition("@")
    if stem not in SET_WHAT:
        return "-"
    when = "an early" if early else "the last"
    return f"{SET_WHAT[stem]}; {when} appearance ({_int(point.get('eval_epoch'))}) replayed"


def vs_best(payload: dict, default: str = DEFAULT) -> list[tuple[dict, float]]:
    """``(point, the default's time / the better of none and suffix)`` at the reference cost model, each with its
    own drafter CPU (``time_cpu_vs_best``), for every point that has the figure."""
    c = c_tok_key(payload)
    found = [(p, ratio(p, c, default, "time_cpu_vs_best")) for p in payload["points"]]
    return [(p, v) for p, v in found if math.isfinite(v) and v > 0]


def headline_sentence(payload: dict, default: str = DEFAULT) -> str:
    """The headline: the default against the better of no speculation and vLLM's ``suffix`` on each replay point,
    with the drafters' own CPU: the geometric mean, the range and how many points are slower, over every point."""
    found = vs_best(payload, default)
    if not found:
        return "_The suite JSON has no result for the default drafter against none and `suffix`._"
    vals = [v for _, v in found]
    mean = math.exp(sum(map(math.log, vals)) / len(vals))
    n = len(payload["points"])
    over = f"{n} recorded rollout batches" if len(vals) == n else f"{len(vals)} of {n} recorded rollout batches"
    slower = sum(v > 1.0 for v in vals)
    return ("das-trl drafts each GRPO rollout from the run's own earlier rollouts. Replaying "
            f"{over} (table below), the default drafter's batch takes {_num(mean)}x the time of the better of no "
            f"speculation and vLLM's `suffix` on each batch (geometric mean; range {_num(min(vals))}x to "
            f"{_num(max(vals))}x, slower than that baseline on {slower} of the {len(vals)}), each drafter's own CPU "
            "counted, in "
            f"cost-model time, not GPU wall time (c_tok {_c(c_tok_key(payload))} ms per verified token).")


def headline_table(payload: dict, default: str = DEFAULT) -> str:
    """The headline's points: set, what it is, requests, problems, the default vs none and vs the better of none
    and ``suffix`` (times with each drafter's CPU)."""
    c = c_tok_key(payload)
    rows = [[f"`{p['name']}`", set_what(p), _int(p.get("requests")), _int(p.get("problems")),
             _num(ratio(p, c, default, "time_cpu_vs_none")), f"**{_num(ratio(p, c, default, 'time_cpu_vs_best'))}**"]
            for p in payload["points"]]
    return _table(["batch replayed", "what it is", "requests", "problems", "default / none",
                   "default / better of none and `suffix`"], rows, ["---", "---"] + ["---:"] * 4)


def headline_block(payload: dict, default: str = DEFAULT) -> str:
    return headline_sentence(payload, default) + "\n\n" + headline_table(payload, default)


def readme_block(payload: dict, default: str = DEFAULT) -> str:
    return (headline_block(payload, default) + "\n\n"
            f"![Running requests over time: none, suffix, the default, oracle-text](docs/img/{HEADLINE_PNG})\n\n"
            "How this is measured, every set and the bounds: [docs/benchmarks.md](docs/benchmarks.md).")


def page_blocks(payload: dict, default: str = DEFAULT) -> dict[str, Callable[[], str]]:
    """The blocks of the pages by marker name (each a function: only the blocks a page has run)."""
    return {"settings": lambda: settings_block(payload), "headline": lambda: headline_block(payload, default),
            "main-table": lambda: main_table(payload, None, default),
            "cost-table": lambda: cost_table(payload, default),
            "engine-table": lambda: engine_table(payload, default),
            "sets-table": lambda: sets_table(payload), "reliability": lambda: reliability_block(payload, default),
            "readme": lambda: readme_block(payload, default), "realdata-sources": realdata_sources_block}


def realdata_sources_block() -> str:
    """Where the third-party sets come from (not from the JSON: :data:`das_trl.bench.realdata.SETS`)."""
    from das_trl.bench.realdata import sources_block

    return sources_block()


def replace_blocks(text: str, blocks: dict[str, Callable[[], str]], where: str = "page") -> str:
    """``text`` with every ``<!-- bench:NAME:start -->`` ... ``<!-- bench:NAME:end -->`` block's content replaced by
    ``blocks[NAME]()``; ValueError for a marker with no generator."""
    def sub(m: re.Match) -> str:
        name = m.group(2)
        if name not in blocks:
            raise ValueError(f"{where}: unknown block <!-- bench:{name}:start -->; known: {', '.join(blocks)}")
        return f"{m.group(1)}{blocks[name]().rstrip()}\n{m.group(4)}"

    return _BLOCK.sub(sub, text)


def block_names(text: str) -> list[str]:
    return [m.group(2) for m in _BLOCK.finditer(text)]


_MARKER = re.compile(r"<!--\s*bench:([^:>]*):(start|end)\s*-->", re.I)


def check_markers(text: str, where: str = "page") -> None:
    """ValueError unless every ``bench:`` marker in ``text`` belongs to a well-formed block (a start and the end of
    the same lower-case name, in that order): a stray or mismatched marker would leave its block silently stale."""
    paired = 2 * len(block_names(text))
    markers = [m.group(0) for m in _MARKER.finditer(text)]
    if len(markers) != paired:
        inside = {m.start() for b in _BLOCK.finditer(text) for m in _MARKER.finditer(text, b.start(), b.end())}
        stray = [m.group(0) for m in _MARKER.finditer(text) if m.start() not in inside]
        raise ValueError(f"{where}: marker{'s' if len(stray) > 1 else ''} {', '.join(stray) or markers[0]} not part "
                         "of a <!-- bench:NAME:start --> ... <!-- bench:NAME:end --> block (same lower-case NAME)")


# ---------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="das-trl bench page", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True, help="the suite JSON (das-trl bench suite --json)")
    p.add_argument("--pages", nargs="+", default=["docs/benchmarks.md", "benchmarks/realdata.md", "README.md"],
                   help="markdown files whose marked blocks are rewritten (default: %(default)s)")
    p.add_argument("--img", default="docs/img", help="folder for the figures (default: %(default)s)")
    p.add_argument("--no-figures", action="store_true", help="rewrite the blocks only")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a page's blocks differ from what the JSON gives")
    return p.parse_args(argv)


def check_img_folder(folder: Path) -> None:
    """Refuse a figure folder that cannot be created or written, before anything is written.

    Raises:
        ValueError: ``folder`` or one of its parents is a file, or the nearest existing folder is not writable.
    """
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"--img {folder}: {existing} is a file, so the figures cannot go there; give a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--img {folder}: {existing} is not writable; give a folder you can write to")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    payload = load(args.json)
    every = set().union(*(p.get("by_c_tok", {}) for p in payload["points"]))
    if every != set(c_tok_keys(payload)):  # the tables use the cost models every point has
        print(f"warning: {args.json}: cost model(s) {', '.join(sorted(every - set(c_tok_keys(payload)), key=float))} "
              "missing from some points are left out; the page uses c_tok " + c_tok_key(payload), file=sys.stderr)
    blocks = page_blocks(payload)
    new_texts = {}
    for page in map(Path, args.pages):  # every page is generated before any is written
        if not page.is_file():
            raise FileNotFoundError(f"--pages: {page} is not a file")
        text = page.read_text()
        if not block_names(text):
            raise ValueError(f"--pages: {page} has no <!-- bench:NAME:start --> ... <!-- bench:NAME:end --> block")
        check_markers(text, f"--pages: {page}")
        new = replace_blocks(text, blocks, str(page))
        if new != text:
            new_texts[page] = new
    if not args.check and not args.no_figures:
        check_img_folder(Path(args.img))  # before any page is written
    stale = [str(page) for page in new_texts]
    if args.check:
        print("up to date" if not stale else f"differs from {args.json}: {', '.join(stale)}")
        return 1 if stale else 0
    for page, new in new_texts.items():
        page.write_text(new)
        print(f"rewrote {page}")
    if not args.no_figures:
        from das_trl.bench.figures import write_figures

        drawn = write_figures(payload, Path(args.img))
        for f in drawn:
            print(f"wrote {f}")
        for name in sorted({HEADLINE_PNG, BY_SET_PNG, RELIABILITY_PNG} - {Path(f).name for f in drawn}):
            # the pages link every figure: an earlier run's file would stand for data this JSON does not have
            print(f"warning: {args.json} has no data for {Path(args.img) / name}; an existing file there is from "
                  "another run (delete it, or replay with the data)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Reading the replay suite's JSON (what ``das-trl bench suite --json`` writes,
:func:`das_trl.bench.report.write_suite_json`): the file, its cost models, the ratios and bounds of a point, the
default's reliability summaries, and the names of the figures drawn from it. Shared by the page
(:mod:`das_trl.bench.page`) and the figures (:mod:`das_trl.bench.figures`)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from das_trl.bench.report import DEFAULT

#: The cost model the page's main table and figures use (the c_tok in the JSON closest to it).
REFERENCE_C_TOK = 0.025
#: The headline figure's two replay points: one large batch, one converged GRPO run (its last appearance).
HEADLINE_SETS = ("frozen_smollm2_t06", "qwen25_05b_gsm8k_grpo_das")
#: The two bounds every suite writes; further ``"bound": true`` entries follow them.
BOUNDS = ("oracle-trim", "oracle-text")
#: Figure files (under ``docs/img/``) and how the pages name them.
HEADLINE_PNG = "bench_headline.png"
BY_SET_PNG = "bench_by_set.png"
RELIABILITY_PNG = "bench_reliability.png"


def load(path: str | Path) -> dict:
    """The suite JSON at ``path`` (plain or gzipped); ValueError naming the file when it is not one."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--json {path}: no such file (write it with das-trl bench suite --json)")
    try:
        raw = Path(path).read_bytes()
        payload = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError) as exc:
        raise ValueError(f"--json {path}: not JSON ({exc})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("points"), list) or not payload["points"]:
        raise ValueError(f"--json {path}: no 'points' (write it with das-trl bench suite --json)")
    for i, p in enumerate(payload["points"]):  # the shape the page reads; the numbers themselves may be missing
        where = f"--json {path}: point {i}"
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            raise ValueError(f"{where} is not an object with a 'name' (write it with das-trl bench suite --json)")
        by_c = p.get("by_c_tok", {})
        if not isinstance(by_c, dict) or not all(isinstance(b, dict) for b in by_c.values()):
            raise ValueError(f"{where} ({p['name']}): 'by_c_tok' must map cost models to objects")
        for c, b in by_c.items():
            if not isinstance(b.get("ratios", {}), dict) or not isinstance(b.get("results", []), list):
                raise ValueError(f"{where} ({p['name']}) at c_tok {c}: 'ratios' must be an object and 'results' a "
                                 "list")
    return payload


def c_tok_key(payload: dict, want: float = REFERENCE_C_TOK) -> str:
    """The ``by_c_tok`` key closest to ``want`` (the keys every point has)."""
    keys = set.intersection(*(set(p.get("by_c_tok", {})) for p in payload["points"]))
    if not keys:
        raise ValueError("the suite JSON has no cost model common to every point")
    return min(sorted(keys, key=float), key=lambda k: abs(float(k) - want))


def c_tok_keys(payload: dict) -> list[str]:
    """Every cost model common to every point, cheapest verification first."""
    keys = set.intersection(*(set(p.get("by_c_tok", {})) for p in payload["points"]))
    return sorted(keys, key=float)


def ratio(point: dict, c: str, name: str, key: str) -> float:
    """``ratios[name][key]`` of ``point`` at cost model ``c``; nan when absent."""
    v = point.get("by_c_tok", {}).get(c, {}).get("ratios", {}).get(name, {}).get(key)
    return float(v) if isinstance(v, (int, float)) else math.nan


def variant_ratio(point: dict, variant: str, c: str, name: str, key: str) -> float:
    """``ratios[name][key]`` of ``point``'s variant ``variant`` (another verification shape, ``"admission"``) at cost
    model ``c``; nan when absent."""
    v = point.get("variants", {}).get(variant, {}).get(c, {}).get("ratios", {}).get(name, {}).get(key)
    return float(v) if isinstance(v, (int, float)) else math.nan


def variant_result(point: dict, variant: str, c: str, name: str) -> dict:
    """The summary of drafter ``name``'s result in ``point``'s variant ``variant`` at ``c`` (``{}`` when absent)."""
    for r in point.get("variants", {}).get(variant, {}).get(c, {}).get("results", []):
        if isinstance(r, dict) and r.get("drafter") == name:
            return r
    return {}


def variant_names(payload: dict) -> list[str]:
    """The variants some point of the suite JSON has, in first-seen order."""
    out: list[str] = []
    for p in payload["points"]:
        for v in p.get("variants", {}) if isinstance(p.get("variants"), dict) else ():
            if v not in out:
                out.append(v)
    return out


def bound_names(payload: dict, c: str) -> list[str]:
    """The bounds in the JSON at ``c``: oracle-trim, oracle-text, then any other ``"bound": true`` entry, in order."""
    extra: list[str] = []
    for p in payload["points"]:
        for name, x in p.get("by_c_tok", {}).get(c, {}).get("ratios", {}).items():
            if isinstance(x, dict) and x.get("bound") and name not in BOUNDS and name not in extra:
                extra.append(name)
    present = [b for b in BOUNDS if any(b in p.get("by_c_tok", {}).get(c, {}).get("ratios", {})
                                        for p in payload["points"])]
    return present + extra


def find_point(payload: dict, name: str) -> dict | None:
    return next((p for p in payload["points"] if p.get("name") == name), None)


def reliability_of(point: dict, c: str, default: str) -> object:
    """The default drafter's reliability summary at cost model ``c`` (in its result), else the point's own entry."""
    block = point.get("by_c_tok", {}).get(c, {})
    for r in block.get("results", []):
        if isinstance(r, dict) and r.get("drafter") == default and r.get("reliability"):
            return r["reliability"]
    return point.get("reliability") or block.get("reliability")


def reliability_points(payload: dict, default: str = DEFAULT) -> list[tuple[str, object]]:
    """``(point name, reliability summary)`` of the default at the reference cost model, for every point that has
    one."""
    c = c_tok_key(payload)
    return [(p["name"], rel) for p in payload["points"] if (rel := reliability_of(p, c, default))]

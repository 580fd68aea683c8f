"""Docs and recipes stay buildable: the configuration reference is current, ``mkdocs build --strict`` passes (and
fails on a broken link), every recipe config uses only fields the recipe accepts, every image a user page shows
exists, the user pages name no issue or session numbers, and the benchmarks page's generated blocks match the
committed suite JSON."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300)


def test_configuration_reference_is_current():
    from das_trl.trainer.config import DASGRPOConfig

    generator = _load(ROOT / "scripts" / "gen_config_reference.py", "gen_config_reference")
    text = generator.render()
    for f in fields(DASGRPOConfig):
        if f.name.startswith("das_"):
            assert f"## {f.name}\n" in text and " ".join(f.metadata["help"].split()) in text
    assert (ROOT / "docs" / "configuration.md").read_text() == text, \
        "docs/configuration.md is out of date: run python scripts/gen_config_reference.py"


def test_mkdocs_strict_build_passes_and_fails_on_a_broken_link(tmp_path):
    result = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").exists()

    # The same docs with one broken link must fail: strict mode is on.
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)  # symlinked pages (changelog, recipes) are copied as files
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\nSee [missing](no-such-page.md).\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    broken = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site2")
    assert broken.returncode != 0 and "no-such-page.md" in broken.stdout + broken.stderr


@pytest.mark.parametrize("config", sorted((ROOT / "recipes" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_recipe_configs_use_known_fields(config):
    from trl import ModelConfig

    from das_trl.defaults.data import is_reasoning_gym_name, reasoning_gym_tasks
    from das_trl.trainer import DASGRPOConfig

    recipe = _load(ROOT / "recipes" / "grpo_das.py", "grpo_das_recipe")
    known = {f.name for cls in (recipe.ScriptArguments, DASGRPOConfig, ModelConfig) for f in fields(cls)}
    values = yaml.safe_load(config.read_text())
    unknown = sorted(set(values) - known)
    assert not unknown, f"{config.name}: unknown fields {unknown}"
    recipe.resolve_reward_funcs(values.get("reward_funcs", ["rg_correctness", "format"]))
    if is_reasoning_gym_name(values.get("dataset", "rg:gsm_symbolic")):
        assert values.get("dataset", "rg:gsm_symbolic").removeprefix("rg:") in reasoning_gym_tasks()


def test_accelerate_configs_parse():
    files = sorted((ROOT / "recipes" / "accelerate").glob("*.yaml"))
    names = {p.stem for p in files}
    assert {"one_gpu", "ddp", "zero2", "zero3", "fsdp", "multi_node"} <= names, names
    for path in files:
        config = yaml.safe_load(path.read_text())
        assert config["distributed_type"] in {"NO", "MULTI_GPU", "DEEPSPEED", "FSDP"}, path.name
        assert config["num_processes"] >= 1 and config["num_machines"] >= 1, path.name
    assert yaml.safe_load((ROOT / "recipes" / "accelerate" / "zero3.yaml").read_text())[
        "deepspeed_config"]["zero_stage"] == 3


def test_unknown_reward_name_is_a_clear_error():
    recipe = _load(ROOT / "recipes" / "grpo_das.py", "grpo_das_recipe")
    with pytest.raises(ValueError, match="unknown reward function 'nope'"):
        recipe.resolve_reward_funcs(["nope"])
    assert recipe.resolve_reward_funcs(["das_trl.defaults.rewards:format_reward"])[0].__name__ == "format_reward"


# ---------------------------------------------------------------------------- user pages (docs/*.md, README.md)
USER_PAGES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "changelog.md") + [ROOT / "README.md"]
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img\s[^>]*src=\"([^\"]+)\"")
#: An issue or session number of this repository ("issue 16", "sessions 17-20"); "vLLM issue #30436" is not one.
_NUMBERED = re.compile(r"\b(?:issue|session)s?\s+\d", re.I)


def _images(page: Path) -> list[str]:
    return [a or b for a, b in _IMAGE.findall(page.read_text())]


def test_every_image_a_page_references_exists():
    seen = 0
    for page in USER_PAGES:
        for ref in _images(page):
            if ref.startswith(("http://", "https://")):
                continue
            path = (page.parent / ref).resolve()
            assert path.is_file(), f"{page.relative_to(ROOT)} shows {ref}, which does not exist"
            assert path.stat().st_size < 150_000, f"{ref}: {path.stat().st_size} bytes (keep figures under 150 KB)"
            seen += 1
    assert seen >= 3  # the benchmarks page's two figures and the README's headline
    assert any(_images(ROOT / "README.md")) and len(_images(ROOT / "docs" / "benchmarks.md")) >= 1


def test_image_check_fails_on_a_missing_image(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("![a figure](img/missing.png) and <img src=\"img/also.png\">\n")
    assert _images(page) == ["img/missing.png", "img/also.png"]
    assert not any((page.parent / ref).is_file() for ref in _images(page))


def test_user_pages_name_no_issue_or_session_numbers():
    """The user pages and the changelog (on the docs site as docs/changelog.md) describe the package, not how it was
    made: issue and session numbers belong in benchmarks/NOTES.md."""
    found = [f"{page.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for page in USER_PAGES + [ROOT / "CHANGELOG.md"]
             for i, line in enumerate(page.read_text().splitlines(), 1) if _NUMBERED.search(line)]
    assert not found, "issue/session numbers belong in benchmarks/NOTES.md:\n" + "\n".join(found)
    assert _NUMBERED.search("as measured in Session 20") and _NUMBERED.search("issues 13 and 16")
    assert not _NUMBERED.search("vLLM issue #30436")


def test_benchmarks_page_is_short_and_its_tables_come_from_the_committed_json():
    from das_trl.bench import page

    bench = ROOT / "docs" / "benchmarks.md"
    assert len(bench.read_text().splitlines()) <= 400
    payload = page.load(ROOT / "benchmarks" / "results" / "suite.json.gz")
    blocks = page.page_blocks(payload)
    for path, needed in ((bench, {"headline", "main-table", "cost-table", "sets-table", "settings"}),
                         (ROOT / "README.md", {"readme"})):
        text = path.read_text()
        assert needed <= set(page.block_names(text)), f"{path.name}: missing generated blocks"
        assert page.replace_blocks(text, blocks) == text, (
            f"{path.name} differs from benchmarks/results/suite.json.gz: run bash scripts/bench_page.sh --page-only")
    # The check can fail: a hand-edited figure in the table is caught.
    edited = bench.read_text().replace("| **", "| **9", 1)
    assert page.replace_blocks(edited, blocks) != edited


# ---------------------------------------------------------------------------- references that must resolve
#: Pages whose links and references are checked: the user pages, the recipes' READMEs (not in the mkdocs site, so
#: mkdocs' own anchor validation never sees them) and the changelog's links (its prose may name old files).
REFERENCE_PAGES = USER_PAGES + sorted((ROOT / "recipes").rglob("README.md"))
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: "`docs/benchmarks.md`, "Reproduce"": a section named in prose.
_NAMED_SECTION = re.compile(r"`?docs/([\w-]+\.md)`?,\s*\"([^\"]+)\"")
_DOCS_ANCHOR = re.compile(r"\bdocs/([\w-]+\.md)#([\w-]+)")
_DOCS_PAGE = re.compile(r"\bdocs/([\w-]+\.md)\b")
#: A test file (``tests/x/test_y.py``, or ``test_y.py`` alone), optionally with ``::test_function``.
_TEST_FILE = re.compile(r"(?<![\w/])((?:tests/)?(?:\w+/)*test_\w+\.py|tests/[\w/]+\.py)(?:::(\w+))?")
#: A test function named alone (``test_x``; ``test_reliability_*`` is a pattern, not a name).
_TEST_NAME = re.compile(r"(?<![\w/.:])(test_\w+)(?![\w.*])")


def _headings(page: Path) -> list[str]:
    """The text of every Markdown heading of ``page`` outside fenced code, inline markup removed."""
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(2))
            out.append(text.replace("`", "").replace("**", "").replace("*", ""))
    return out


def _anchors(page: Path) -> set[str]:
    """The ids Python-Markdown's toc extension (mkdocs) gives ``page``'s headings: its slugify, ``_1``, ``_2`` ... for
    repeats."""
    from markdown.extensions.toc import slugify

    seen: dict[str, int] = {}
    out = set()
    for heading in _headings(page):
        slug = slugify(heading, "-")
        out.add(slug if slug not in seen else f"{slug}_{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def _test_functions() -> set[str]:
    return {name for path in (ROOT / "tests").rglob("*.py")
            for name in re.findall(r"^\s*(?:async )?def (test_\w+)\(", path.read_text(), re.M)}


def broken_references(page: Path, test_names: set[str]) -> list[str]:
    """Every link or reference of ``page`` that does not resolve: a linked file that does not exist, a ``#section``
    no heading of the target page has, a section named in prose (`` `docs/x.md`, "Title" ``) that is not a heading
    there, a ``docs/x.md`` path that does not exist, and a test file, ``file::function`` or test function the tests
    do not have (renamed or removed)."""
    text, found = page.read_text(), []
    if page.name.lower() != "changelog.md":  # the changelog's history may name files since renamed; its links must work
        for match in _NAMED_SECTION.finditer(text):
            target = ROOT / "docs" / match.group(1)
            if not target.is_file() or match.group(2) not in _headings(target):
                found.append(f"section {match.group(0)}")
        for match in _DOCS_PAGE.finditer(text):
            if not (ROOT / "docs" / match.group(1)).is_file():
                found.append(f"page {match.group(0)}")
        for match in _TEST_FILE.finditer(text):
            name, function = match.groups()
            files = ([ROOT / name] if name.startswith("tests/")
                     else list((ROOT / "tests").rglob(Path(name).name)))
            files = [f for f in files if f.is_file()]
            if not files:
                found.append(f"test file {name}")
            elif function and not any(re.search(rf"^\s*(?:async )?def {function}\(", f.read_text(), re.M)
                                      for f in files):
                found.append(f"test {name}::{function}")
        found += [f"test {name}" for name in _TEST_NAME.findall(text) if name not in test_names]
    for match in _DOCS_ANCHOR.finditer(text):
        target = ROOT / "docs" / match.group(1)
        if not target.is_file() or match.group(2) not in _anchors(target):
            found.append(f"anchor {match.group(0)}")
    for link in _LINK.findall(text):
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = link.partition("#")
        target = page if not path else (page.parent / path).resolve()
        if not target.exists():
            found.append(f"link {link}")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            found.append(f"link {link} (no such section)")
    return found


def test_links_sections_and_test_files_named_in_the_docs_exist():
    names = _test_functions()
    pages = REFERENCE_PAGES + [ROOT / "CHANGELOG.md"]
    broken = [f"{page.relative_to(ROOT)}: {ref}" for page in pages for ref in broken_references(page, names)]
    # The code's own help texts and docstrings point users at docs pages and sections too.
    for path in sorted((ROOT / "das_trl").rglob("*.py")):
        text = path.read_text()
        broken += [f"{path.relative_to(ROOT)}: page {m.group(0)}" for m in _DOCS_PAGE.finditer(text)
                   if not (ROOT / "docs" / m.group(1)).is_file()]
        broken += [f"{path.relative_to(ROOT)}: anchor {m.group(0)}" for m in _DOCS_ANCHOR.finditer(text)
                   if m.group(2) not in _anchors(ROOT / "docs" / m.group(1))]
    assert not broken, "references that do not resolve:\n" + "\n".join(broken)


def test_reference_check_fails_on_each_kind_of_broken_reference(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Window (`das_window`, default 16)\n\n```bash\n# not a heading\n```\n\n"
                    "[ok](#window-das_window-default-16) [ok too](#a-page)\n")
    assert broken_references(page, set()) == []
    assert "not-a-heading" not in _anchors(page)
    page.write_text(page.read_text()
                    + "[gone](#no-such-section) [missing](missing.md) see `docs/tuning.md`, \"No such section\"; "
                      "`docs/tuning.md#no-such-anchor`, docs/no-such-page.md, tests/test_no_such_file.py, "
                      "`tests/test_docs.py::test_no_such_test`, `test_no_such_function`\n")
    found = broken_references(page, _test_functions())
    assert found == ['section `docs/tuning.md`, "No such section"', "page docs/no-such-page.md",
                     "test file tests/test_no_such_file.py", "test tests/test_docs.py::test_no_such_test",
                     "test test_no_such_function", "anchor docs/tuning.md#no-such-anchor",
                     "link #no-such-section (no such section)", "link missing.md"], found

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
    found = [f"{page.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for page in USER_PAGES
             for i, line in enumerate(page.read_text().splitlines(), 1) if _NUMBERED.search(line)]
    assert not found, "issue/session numbers belong in the changelog or benchmarks/NOTES.md:\n" + "\n".join(found)
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

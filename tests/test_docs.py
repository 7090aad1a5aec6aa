"""The documentation: a README a newcomer reads in minutes, and a site that builds strictly (a broken link,
a missing page, a docstring that does not render) with the HTTP API generated from the live OpenAPI."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_short_and_links_only_existing_pages():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for target in __import__("re").findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", readme):
        assert (ROOT / target).is_file(), target


def test_http_api_page_is_generated_from_the_openapi_document():
    from openapi_page import render, service_openapi

    page = render(service_openapi())
    assert "## POST `/generate`" in page and "## POST `/score`" in page and "## POST `/v1/completions`" in page
    assert "| `num_samples` | integer |" in page and "### GenerateRequest" in page


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([str(Path(sys.executable).with_name("mkdocs")), "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "http-api" / "index.html").read_text().count("num_samples") >= 2
    for card in (ROOT / "checkpoints").glob("*/model_card.md"):  # each card is a page of the site
        page = (tmp_path / "site" / "cards" / card.parent.name / "index.html").read_text()
        assert "GET /models/" in page and card.parent.name in page


@pytest.mark.slow
def test_documented_recipe_commands_name_real_scripts_configs_and_flags():
    """Every `python training/<recipe>.py ...` command in the README and the docs names a recipe that exists, a
    config that exists and only flags the recipe's parser knows (commands joined across line continuations)."""
    import re

    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commands = []
    for path in texts:
        joined = re.sub(r"\\\n\s*", " ", path.read_text())
        commands += [(path.name, m.group(0)) for m in re.finditer(r"python3? training/\w+\.py[^\n`]*", joined)]
    assert len(commands) > 20
    helps = {}
    for where, command in commands:
        script = re.search(r"training/(\w+\.py)", command).group(1)
        assert (ROOT / "training" / script).is_file(), (where, command)
        if script not in helps:
            done = subprocess.run([sys.executable, str(ROOT / "training" / script), "--help"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (script, done.stderr[-2000:])
            helps[script] = done.stdout
        own = command.split(" -- ")[0]  # after " -- ": another recipe's arguments (ray_train.py)
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", own):
            assert flag in helps[script], (where, command, flag)
        config = re.search(r"--config (\S+)", command)
        if config and not config.group(1).endswith(".yaml"):
            assert (ROOT / "training" / "configs" / f"{config.group(1)}.yaml").is_file(), (where, command)

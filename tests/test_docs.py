"""The documentation site (docs/, mkdocs.yml) and the README in front of it.

- The CLI reference (docs/getting-started/cli.md) is generated from the argument parsers: every flag that
  `tensorgate serve --help` and `tensorgate perf --help` print must be on it, and the page must be what
  the parsers give today (docs/hooks/cli_reference.py; `make docs` rewrites it).
- `mkdocs build --strict` must pass: a broken link, a missing page or a dead anchor fails it, as a
  deliberately broken copy of the site shows.
- The README stays short (under 200 lines) and its links into docs/ lead to pages that exist.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import cli_reference  # noqa: E402

MKDOCS = [sys.executable, "-m", "mkdocs"]
FLAG = re.compile(r"(?<![\w-])--[a-z0-9]+(?:-[a-z0-9]+)*")


def flags_in_help(*command: str) -> set[str]:
    shown = subprocess.run(
        [sys.executable, "-m", "tensorgate.server", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "1000"},  # one line a flag: no flag cut at a hyphen
    ).stdout
    # an option's line: "  -b, --batch-size N   help...": the flags before the help
    heads = [re.split(r"\s{2,}", line.strip())[0] for line in shown.splitlines() if line.startswith("  -")]
    return {flag for head in heads for flag in FLAG.findall(head)} - {"--help"}


def undocumented(flags: set[str], page: str) -> list[str]:
    """The flags that no row of the page names (a row's first cell: `` | `-b, --flag VALUE` ``)."""
    first_cells = re.findall(r"^\| `([^`]*)`", page, re.M)
    named = {flag for cell in first_cells for flag in FLAG.findall(cell)}
    return sorted(flags - named)


def test_every_serve_flag_is_in_the_cli_reference() -> None:
    flags = flags_in_help("serve")
    assert len(flags) >= 40 and "--model-repository" in flags and "--workers" in flags
    assert undocumented(flags, cli_reference.PAGE.read_text()) == []


def test_every_perf_flag_is_in_the_cli_reference() -> None:
    flags = flags_in_help("perf")
    assert len(flags) >= 20 and "--concurrency" in flags
    assert undocumented(flags, cli_reference.PAGE.read_text()) == []


def test_a_flag_missing_from_the_page_is_found() -> None:
    """Positive control: the check above sees a row that is not there."""
    page = cli_reference.PAGE.read_text()
    without = "\n".join(line for line in page.splitlines() if not line.startswith("| `--workers "))
    assert without != page
    assert undocumented(flags_in_help("serve"), without) == ["--workers"]


def test_the_page_is_what_the_parsers_give() -> None:
    assert cli_reference.PAGE.read_text() == cli_reference.markdown(), "run `make docs`"


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*MKDOCS, "build", "--strict", "-f", str(config), "-d", str(site)],  # not -q: it stops the count
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "getting-started" / "cli" / "index.html").exists()


def broken_copy(tmp_path: Path, damage: str) -> Path:
    """The site's pages copied to tmp_path under a config that inherits the site's, one page given a
    link that leads nowhere."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    page = docs / "index.md"
    page.write_text(page.read_text() + f"\n{damage}\n")
    hooks = re.findall(r"^\s*-\s*(docs/hooks/\S+\.py)", (ROOT / "mkdocs.yml").read_text(), re.M)
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: {docs}\n"
        + "hooks:\n"
        + "".join(f"  - {ROOT / hook}\n" for hook in hooks)
    )
    return config


def test_a_dead_link_fails_the_build(tmp_path: Path) -> None:
    built = build(broken_copy(tmp_path, "See [the flags](getting-started/no-such-page.md)."), tmp_path / "s")
    assert built.returncode != 0 and "no-such-page.md" in built.stderr


def test_a_dead_anchor_fails_the_build(tmp_path: Path) -> None:
    built = build(
        broken_copy(tmp_path, "See [the flags](getting-started/cli.md#no-such-anchor)."), tmp_path / "s"
    )
    assert built.returncode != 0 and "no-such-anchor" in built.stderr


def test_the_readme_is_short_and_links_to_pages_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    pages = re.findall(r"\]\((docs/[^)#\s]+)", readme)
    assert len(pages) >= 5, "the README links into the docs"
    assert [page for page in pages if not (ROOT / page).exists()] == []

"""The CLI reference page (docs/getting-started/cli.md), generated from the argument parsers.

- `python docs/hooks/cli_reference.py` (`make docs` runs it) writes the page from `tensorgate serve`'s
  parser (server/options.py, its flags in server/options_*.py) and `tensorgate perf`'s (perf/cli.py).
- As an MkDocs hook (mkdocs.yml `hooks:`), it fails the build when the committed page is not what the
  parsers give today: a flag added without `make docs` fails `mkdocs build --strict` and the suite.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started" / "cli.md"

# `tensorgate serve`'s flags by topic: the first topic whose prefixes match a flag's name takes it.
SERVE_TOPICS: list[tuple[str, tuple[str, ...]]] = [
    (
        "Security",
        (
            "--http-restricted-api",
            "--grpc-restricted-protocol",
            "--ssl-",
            "--grpc-use-ssl",
            "--grpc-server-",
            "--grpc-root-cert",
        ),
    ),
    (
        "Models and the repository",
        (
            "--model-",
            "--load-model",
            "--repository-",
            "--python-",
            "--strict-",
            "--disable-auto-complete",
            "--exit-on-error",
            "--rate-limit",
            "--backend-config",
        ),
    ),
    (
        "Ports and protocols",
        (
            "--host",
            "--http-address",
            "--grpc-address",
            "--metrics-address",
            "--allow-http",
            "--allow-grpc",
            "--id",
            "--http-port",
            "--grpc-port",
            "--grpc-max-message",
            "--metrics-port",
            "--http-header-forward-pattern",
            "--grpc-header-forward-pattern",
        ),
    ),
    (
        "The transport and its limits",
        (
            "--max-",
            "--http",
            "--ssl-",
            "--grpc-http2-",
            "--grpc-keepalive-",
            "--grpc-max-connection-age",
            "--grpc-infer-response-compression-level",
            "--graceful-",
            "--exit-timeout-secs",
        ),
    ),
    ("Workers", ("--workers", "--worker-", "--engine-front-end")),
    ("grps", ("--grps-", "--monitor-")),
    (
        "Shared memory, metrics and the response cache",
        ("--allow-", "--metrics-", "--cache-", "--response-cache-"),
    ),
    ("Logging and tracing", ("--log-", "--trace-")),
]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _usage(action: argparse.Action) -> str:
    """The flag's cell, code text: a pipe there would show its escape, so `true|false` reads true/false."""
    names = ", ".join(action.option_strings) or action.dest
    if action.option_strings and action.nargs != 0:
        names += " " + (action.metavar or (action.choices and "{" + ",".join(map(str, action.choices)) + "}")
                        or action.dest.upper())  # fmt: skip
    return names.replace("|", "/")


def _rows(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> list[str]:
    formatter = parser._get_formatter()
    rows = ["| flag | what it does |", "|---|---|"]
    for action in actions:
        help_text = formatter._expand_help(action) if action.help else ""
        required = " **Required.**" if action.required else ""
        rows.append(f"| `{_cell(_usage(action))}` | {_cell(help_text)}{required} |")
    return rows


def documented(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a user may give: every one but --help and those hidden from --help."""
    return [
        action
        for action in parser._actions
        if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
    ]


def topic_of(flag: str) -> str:
    for title, prefixes in SERVE_TOPICS:
        if flag.startswith(prefixes):
            return title
    raise ValueError(f"{flag}: no topic in SERVE_TOPICS (docs/hooks/cli_reference.py) takes it")


def markdown() -> str:
    sys.path.insert(0, str(ROOT))
    from tensorgate.perf.cli import build_parser as perf_parser
    from tensorgate.server.cli import COMMANDS
    from tensorgate.server.options import build_parser as serve_parser

    serve, perf = serve_parser(), perf_parser()
    lines = [
        "# CLI reference",
        "",
        "<!-- Generated from the argument parsers by docs/hooks/cli_reference.py (`make docs`): edit the",
        "     flags' help in server/options_*.py or perf/cli.py, not this page. -->",
        "",
        "`tensorgate` has one subcommand for each job:",
        "",
        "| command | what it does |",
        "|---|---|",
        *(f"| `tensorgate {name}` | {_cell(command.help)} |" for name, command in COMMANDS.items()),
        "",
        "`python -m tensorgate.server` runs the same command line, and `python -m tensorgate.perf` is",
        "`tensorgate perf`.",
        "",
        "## tensorgate serve",
        "",
        f"{serve.description}",
        "",
    ]
    by_topic: dict[str, list[argparse.Action]] = {title: [] for title, _ in SERVE_TOPICS}
    for action in documented(serve):
        by_topic[topic_of(action.option_strings[-1])].append(action)
    for title, actions in by_topic.items():
        lines += [f"### {title}", "", *_rows(serve, actions), ""]
    lines += ["## tensorgate perf", "", f"{perf.description}", "", f"{perf.epilog}", ""]
    for group in perf._action_groups:
        actions = [action for action in group._group_actions if action in documented(perf)]
        if actions:
            lines += [f"### {group.title}", "", *_rows(perf, actions), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def on_pre_build(config: object) -> None:
    """MkDocs: refuse to build from a page the parsers no longer give."""
    from mkdocs.exceptions import PluginError

    if not PAGE.exists() or PAGE.read_text() != markdown():
        raise PluginError(f"{PAGE.relative_to(ROOT)} is not what the argument parsers give: run `make docs`")


if __name__ == "__main__":
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(markdown())
    print(f"wrote {PAGE.relative_to(ROOT)}")

"""The table of docs/operations/triton-flags.md, written from server/tritonserver.py's FLAGS.

`python docs/hooks/triton_flags.py` rewrites the page's table (everything from its header row on) as
`tritonserver` translates. tests/test_tritonserver_cli.py fails while the page is stale.
"""

from __future__ import annotations

from pathlib import Path

from tensorgate.server.tritonserver import markdown_table

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "triton-flags.md"
HEADER = "| Triton's flag |"


def main() -> None:
    text = PAGE.read_text()
    PAGE.write_text(text[: text.index(HEADER)] + markdown_table())
    print(f"wrote {PAGE.relative_to(PAGE.parents[2])}")


if __name__ == "__main__":
    main()

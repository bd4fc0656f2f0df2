"""README.md and docs/ quote measured figures only through tables a command renders: a block

    <!-- include bench/results/results.md#goals -->
    ...
    <!-- end include -->

holds, verbatim, the section of that rendered file under the heading whose anchor is `goals`
(up to the next heading of the same or a higher level; the heading itself is left out). `python
-m bench.docs` rewrites every block from the files as they are now (`make facts` runs it, after
`python -m bench`, `python -m bench.scale` or `python -m bench.facts render`);
tests/test_docs_figures.py fails while a block differs from its source, so no copy goes stale.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger("bench.docs")

REPO = Path(__file__).resolve().parent.parent
# The files that may hold blocks.
DOCUMENTS = ("README.md", "docs/*.md")
_BLOCK = re.compile(
    r"(?P<open><!-- include (?P<path>[^#\s]+)#(?P<anchor>[\w-]+) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<close><!-- end include -->)",
    re.DOTALL,
)
_HEADING = re.compile(r"^(#{1,6}) (.*)$")


class IncludeError(Exception):
    """A block names a file or a heading that does not exist."""


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def section(markdown: str, wanted: str) -> str:
    """The lines under the heading whose anchor is `wanted`, to the next heading of the same
    or a higher level, without blank lines at either end."""
    lines = markdown.splitlines()
    for index, line in enumerate(lines):
        found = _HEADING.match(line)
        if not found or anchor(found[2]) != wanted:
            continue
        level = len(found[1])
        body: list[str] = []
        for following in lines[index + 1 :]:
            heading = _HEADING.match(following)
            if heading and len(heading[1]) <= level:
                break
            body.append(following)
        return "\n".join(body).strip("\n")
    raise IncludeError(f"no heading with the anchor #{wanted}")


def fill(text: str, read: Callable[[str], str]) -> str:
    """`text` with every block's body replaced by its source's section; `read(path)` gives a
    rendered file's text (path relative to the repository)."""

    def replace(block: re.Match[str]) -> str:
        try:
            body = section(read(block["path"]), block["anchor"])
        except (OSError, IncludeError) as error:
            raise IncludeError(f"include {block['path']}#{block['anchor']}: {error}") from None
        return f"{block['open']}{body}\n{block['close']}"

    return _BLOCK.sub(replace, text)


def documents(repo: Path = REPO) -> list[Path]:
    return sorted({path for pattern in DOCUMENTS for path in repo.glob(pattern)})


def stale(repo: Path = REPO) -> list[Path]:
    """The documents whose blocks differ from their sources."""

    def read(path: str) -> str:
        return (repo / path).read_text()

    return [path for path in documents(repo) if fill(path.read_text(), read) != path.read_text()]


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(
        prog="python -m bench.docs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="only list stale documents")
    args = parser.parse_args(argv)
    try:
        outdated = stale()
    except IncludeError as error:
        log.error("%s", error)
        return 1
    if args.check:
        for path in outdated:
            log.error("%s: a block differs from its source (python -m bench.docs)", path)
        return 1 if outdated else 0
    for path in outdated:
        text = fill(path.read_text(), lambda name: (REPO / name).read_text())
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        partial.replace(path)
        log.info("updated %s", path.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())

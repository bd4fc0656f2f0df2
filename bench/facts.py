"""The figures README.md and docs/ quote outside the benchmark: the images' sizes and how long
`make smoke` and `make test` take, each measured by a command and rendered with its date,
commit, machine and load, so no hand-copied number can go stale.

    python -m bench.facts start test    # `make test` runs this first ...
    python -m bench.facts finish test   # ... and this last: its wall time, when it passed, in
                                        # build/facts/test.json
    python -m bench.facts render --images sm-horovod:cpu,sm-horovod:torch-cpu --out bench/results
                                        # measure the sizes (docker image inspect), merge the
                                        # recorded times, write facts.json and facts.md
    python -m bench.facts start build-tf2.21; make build FLAVOR=tf2.21 BUILD_LOG=build/b.log
    python -m bench.facts finish build-tf2.21 --build-log build/b.log
                                        # an image's build time, with its Horovod compile step's
                                        # from BuildKit's log (cached: said so)

`make facts` runs the last. A fact not measured again keeps its last figure and provenance; a
run that failed records nothing (its time says nothing about a passing run's).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.provenance import (
    Provenance,
    Started,
    duration_text,
    provenance_from,
    start_measuring,
)

log = logging.getLogger("bench.facts")

RECORDS = Path("build/facts")
# What `start`/`finish` time: `make smoke`, `make test`, or `make build FLAVOR=<flavor>`.
_COMMANDS = ("smoke", "test")
_BUILD = re.compile(r"build-([a-z0-9][a-z0-9.-]*)")
# The build stage's step that compiles Horovod (Dockerfile, stage `build`), as BuildKit logs it.
_HOROVOD_STEP = "pip wheel --no-cache-dir --no-deps --no-build-isolation"


@dataclasses.dataclass(frozen=True)
class ImageSize:
    image: str
    size_bytes: int
    image_id: str  # which build was measured (docker image inspect's Id, shortened)
    created: str
    built_from: str  # the commit in its `make build` tag (FLAVOR-<sha>), or "?"
    provenance: Provenance


@dataclasses.dataclass(frozen=True)
class CommandTime:
    name: str  # smoke, test
    command: str
    exit_code: int
    provenance: Provenance  # its seconds are the wall time


@dataclasses.dataclass(frozen=True)
class Facts:
    images: dict[str, ImageSize] = dataclasses.field(default_factory=dict)
    commands: dict[str, CommandTime] = dataclasses.field(default_factory=dict)

    def merged(self, later: Facts) -> Facts:
        """`later`'s figures over these; the rest kept as last measured."""
        return Facts({**self.images, **later.images}, {**self.commands, **later.commands})


# ---------------------------------------------------------------------------------------------
# JSON and markdown (pure)


def facts_to_json(facts: Facts) -> str:
    return json.dumps(dataclasses.asdict(facts), indent=2) + "\n"


def _with_provenance(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {**raw, "provenance": provenance_from(raw["provenance"])}


def facts_from_json(text: str) -> Facts:
    raw = json.loads(text)
    return Facts(
        images={k: ImageSize(**_with_provenance(v)) for k, v in raw.get("images", {}).items()},
        commands={
            k: CommandTime(**_with_provenance(v)) for k, v in raw.get("commands", {}).items()
        },
    )


def command_from_json(text: str) -> CommandTime:
    return CommandTime(**_with_provenance(json.loads(text)))


def gigabytes(size_bytes: int) -> str:
    return f"{size_bytes / 1e9:.2f} GB"


def _where(p: Provenance) -> str:
    return f"{p.date}, `{p.commit}`, {p.cores} cores, {p.memory_gib:g} GiB"


def facts_markdown(facts: Facts) -> str:
    lines = [
        "## Image sizes and test times",
        "",
        "Rendered by `make facts` (`python -m bench.facts render`): image sizes from `docker "
        "image inspect` (uncompressed, as `docker images` shows them), wall times as `make smoke` "
        "and `make test` recorded them on their last run here (`build/facts/`), and image builds "
        "timed with `bench.facts start/finish build-<flavor>` (their Horovod compile step from "
        "BuildKit's log). A figure not "
        "measured again keeps its last value and its own date, commit and machine; load: the "
        "machine's 1-minute load average before and after.",
        "",
        "### Image sizes",
        "",
    ]
    if facts.images:
        lines += [
            "| Image | Size | Image id, built, from commit | Measured (date, commit, machine) |",
            "|---|---|---|---|",
            *(
                f"| `{size.image}` | {gigabytes(size.size_bytes)} | `{size.image_id}`, "
                f"{size.created}, `{size.built_from}` | {_where(size.provenance)} |"
                for _, size in sorted(facts.images.items())
            ),
            "",
        ]
    else:
        lines += ["None measured yet (`make build`, then `make facts`).", ""]
    lines += ["### Wall times", ""]
    if facts.commands:
        lines += [
            "| Command | Wall time | Outcome | Measured (date, commit, machine) | "
            "Load before, after |",
            "|---|---|---|---|---|",
        ]
        for _, run in sorted(facts.commands.items()):
            p = run.provenance
            outcome = "passed" if run.exit_code == 0 else f"**failed** (exit {run.exit_code})"
            how = f" ({p.settings})" if p.settings else ""
            lines.append(
                f"| `{run.command}`{how} | {duration_text(p.seconds)} | {outcome} | {_where(p)} | "
                f"{p.load_before:.1f}, {p.load_after:.1f} |"
            )
        lines.append("")
    else:
        lines += ["None recorded yet (`make smoke`, `make test`, then `make facts`).", ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# The shell: run and time a command, inspect images, write files


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def timed_name(name: str) -> str:
    """An argparse type: smoke, test or build-<flavor>."""
    if name in _COMMANDS or _BUILD.fullmatch(name):
        return name
    raise argparse.ArgumentTypeError(f"not smoke, test or build-<flavor>: {name!r}")


def command_of(name: str) -> str:
    build = _BUILD.fullmatch(name)
    return f"make build FLAVOR={build.group(1)}" if build else f"make {name}"


def horovod_compile(build_log: str) -> str:
    """What BuildKit's plain log says of the step that compiled Horovod: its time, or that it
    was cached (the build's time then says nothing about a compile)."""
    steps = re.findall(r"^(#\d+) \[build \d+/\d+\] RUN .*" + re.escape(_HOROVOD_STEP), build_log,
                       flags=re.MULTILINE)  # fmt: skip
    for step in reversed(steps):
        done = re.search(rf"^{step} DONE ([0-9.]+)s$", build_log, flags=re.MULTILINE)
        if done:
            return f"Horovod's compile {duration_text(float(done.group(1)))}"
        if re.search(rf"^{step} CACHED$", build_log, flags=re.MULTILINE):
            return "Horovod's compile cached"
    return "Horovod's compile not in the log"


def start_command(name: str, records: Path) -> None:
    started = start_measuring()
    _write_atomically(records / f"{name}.started", json.dumps(dataclasses.asdict(started)))


def finish_command(name: str, records: Path, build_log: Path | None = None) -> CommandTime:
    """`make NAME` got to its end (make stops at the first failing step): its wall time since
    `start_command`, in records/NAME.json; a build's with its Horovod compile's."""
    marker = records / f"{name}.started"
    started = Started(**json.loads(marker.read_text()))
    if build_log is not None:
        started = dataclasses.replace(started, settings=horovod_compile(build_log.read_text()))
    record = CommandTime(
        name=name,
        command=command_of(name),
        exit_code=0,
        provenance=started.finish(in_this_process=False),
    )
    _write_atomically(records / f"{name}.json", json.dumps(dataclasses.asdict(record), indent=2))
    marker.unlink()
    log.info("%s: %s", record.command, duration_text(record.provenance.seconds))
    return record


def built_from(tags: Sequence[str], image: str) -> str:
    """The commit `make build` tagged `image` with (IMAGE:FLAVOR-<12 hex>), or "?"."""
    repository, _, flavor = image.rpartition(":")
    prefix = f"{repository}:{flavor}-"
    shas = [tag.removeprefix(prefix) for tag in tags if tag.startswith(prefix)]
    return next((sha for sha in shas if re.fullmatch(r"[0-9a-f]{12}", sha)), "?")


def measure_image(docker: str, image: str) -> ImageSize | None:
    started = start_measuring()
    done = subprocess.run(
        [
            docker,
            "image",
            "inspect",
            "--format",
            "{{.Size}} {{.Id}} {{.Created}} {{json .RepoTags}}",
            image,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        log.info("%s: not built here, kept as last measured", image)
        return None
    size, image_id, created, tags = done.stdout.split(maxsplit=3)
    return ImageSize(
        image=image,
        size_bytes=int(size),
        image_id=image_id.removeprefix("sha256:")[:12],
        created=created[:16].replace("T", " ") + " UTC",
        built_from=built_from(json.loads(tags), image),
        provenance=started.finish(),
    )


def render(docker: str, images: Sequence[str], records: Path, out: Path) -> Facts:
    path = out / "facts.json"
    old = facts_from_json(path.read_text()) if path.is_file() else Facts()
    sizes = {image: size for image in images if (size := measure_image(docker, image))}
    commands = {
        record.stem: command_from_json(record.read_text())
        for record in sorted(records.glob("*.json"))
    }
    facts = old.merged(Facts(sizes, commands))
    _write_atomically(path, facts_to_json(facts))
    _write_atomically(out / "facts.md", facts_markdown(facts))
    return facts


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = argparse.ArgumentParser(
        prog="python -m bench.facts", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="what", required=True)
    for what in ("start", "finish"):
        timing = commands.add_parser(what, help=f"{what} timing `make NAME`")
        timing.add_argument("name", type=timed_name, help="smoke, test or build-<flavor>")
        timing.add_argument("--records", type=Path, default=RECORDS)
        if what == "finish":
            timing.add_argument("--build-log", type=Path, help="a build's BuildKit log")
    rendering = commands.add_parser("render", help="measure image sizes, write facts.json/.md")
    rendering.add_argument("--docker", default=os.environ.get("DOCKER", "docker"))
    rendering.add_argument("--images", default="sm-horovod:cpu,sm-horovod:torch-cpu")
    rendering.add_argument("--records", type=Path, default=RECORDS)
    rendering.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    if args.what == "start":
        start_command(args.name, args.records)
        return 0
    if args.what == "finish":
        if not (args.records / f"{args.name}.started").is_file():
            log.error("finish %s: no start recorded in %s", args.name, args.records)
            return 1
        finish_command(args.name, args.records, args.build_log)
        return 0
    images = [image for image in args.images.split(",") if image]
    facts = render(args.docker, images, args.records, args.out)
    print(facts_markdown(facts), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

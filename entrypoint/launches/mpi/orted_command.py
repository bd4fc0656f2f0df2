"""What a worker accepts as OpenMPI's remote command: `orted` and its options, nothing else.

Pure (no I/O). mpirun's rsh launcher (OpenMPI 4.1 `plm_rsh_module.c`, `setup_launch`) hands its
agent the words after the host; ssh would join them with spaces and run them with the remote
login shell. We do not hand them to a shell: `parse_orted_command` tokenizes the joined words as
a POSIX shell would (quotes removed; `;`, `&`, `|`, `<`, `>`, `(`, `)` outside quotes are
operators), accepts exactly the forms OpenMPI 4.1 sends, and returns the argv and environment
additions the worker then runs with `execve` itself:

    [PATH=<P>/bin:$PATH ; export PATH ; LD_LIBRARY_PATH=<P>/lib:${LD_LIBRARY_PATH:-} ;
     export LD_LIBRARY_PATH ; DYLD_LIBRARY_PATH=<P>/lib:${DYLD_LIBRARY_PATH:-} ;
     export DYLD_LIBRARY_PATH ;]  orted|<P>/bin/orted  [--daemonize]  (-mca KEY VALUE)...

(the prefix only when mpirun was called by an absolute path or with --prefix). Everything else
is refused with a reason: any other command, any other shell syntax (the `( test ! -r
./.profile ...` wrapper of an sh login shell too), a value a shell would expand (`$`, backquote,
backslash), any other orted option (`--tree-spawn`: the channel launch turns tree spawn off).
`--daemonize` is dropped: orted stays the worker's child, so its exit reaches mpirun.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence

ORTED = "orted"
# Shell operators (outside quotes); anything but the prefix's `;` is refused.
_SEPARATOR = ";"
_OPERATORS = _SEPARATOR + "&|<>()"
_PREFIX_DIR = re.compile(r"/[A-Za-z0-9._/+-]*")
_MCA_KEY = re.compile(r"[A-Za-z0-9_]+")
# What a shell would still expand inside OpenMPI's double quotes, and what ends a line.
_EXPANDING = re.compile(r"[$`\\\n\x00]")
_LIBRARY_PATHS = ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH")


class RefusedCommandError(ValueError):
    """The command is not one OpenMPI 4.1 sends to start orted: never run it."""


@dataclasses.dataclass(frozen=True)
class OrtedCommand:
    """orted's options (quotes removed, --daemonize dropped) and the install prefix, if any."""

    options: tuple[str, ...]
    prefix: str | None = None

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment the prefix commands would have made from `base`."""
        env = dict(base)
        if self.prefix is not None:
            env["PATH"] = f"{self.prefix}/bin:{base.get('PATH', '')}"
            for name in _LIBRARY_PATHS:
                env[name] = f"{self.prefix}/lib:{base.get(name, '')}"
        return env


def _tokens(words: Sequence[str]) -> list[str]:
    lexer = shlex.shlex(" ".join(words), posix=True, punctuation_chars=_OPERATORS)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError as error:  # an unclosed quote
        raise RefusedCommandError(f"not a command line: {error}") from None


def _segments(tokens: list[str]) -> list[list[str]]:
    """The commands between `;` operators; any other operator is refused."""
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token == _SEPARATOR:
            segments.append([])
        elif token and set(token) <= set(_OPERATORS):
            raise RefusedCommandError(f"shell syntax {token!r} is not part of an orted command")
        else:
            segments[-1].append(token)
    return segments


def _prefix_assignments(prefix: str) -> dict[str, str]:
    return {
        "PATH": f"PATH={prefix}/bin:$PATH",
        **{name: f"{name}={prefix}/lib:${{{name}:-}}" for name in _LIBRARY_PATHS},
    }


def _prefix(setup: list[list[str]]) -> str | None:
    """The install prefix from OpenMPI's `VAR=...; export VAR;` commands (all or none)."""
    if not setup:
        return None
    first = setup[0]
    match = re.fullmatch(r"PATH=(.*)/bin:\$PATH", first[0]) if len(first) == 1 else None
    if match is None or not _PREFIX_DIR.fullmatch(match.group(1)):
        raise RefusedCommandError(f"{' '.join(first)!r} is not OpenMPI's PATH prefix")
    prefix = match.group(1)
    expected: list[list[str]] = []
    for name, assignment in _prefix_assignments(prefix).items():
        expected += [[assignment], ["export", name]]
    if setup != expected[: len(setup)] or len(setup) not in (2, 4, 6):
        raise RefusedCommandError(f"{' ; '.join(map(' '.join, setup))!r} is not OpenMPI's prefix")
    return prefix


def _options(words: list[str]) -> tuple[str, ...]:
    options: list[str] = []
    rest = list(words)
    daemonize_seen = False
    while rest:
        word = rest.pop(0)
        if word == "--daemonize" and not daemonize_seen:
            daemonize_seen = True
            continue
        if word != "-mca" or len(rest) < 2:
            raise RefusedCommandError(f"orted option {word!r} is not one the channel launch allows")
        key, value = rest.pop(0), rest.pop(0)
        if not _MCA_KEY.fullmatch(key):
            raise RefusedCommandError(f"MCA parameter name {key!r} is not a plain name")
        if _EXPANDING.search(value):
            raise RefusedCommandError(f"MCA value for {key} has shell expansion in it: {value!r}")
        options += ["-mca", key, value]
    return tuple(options)


def parse_orted_command(words: Sequence[str]) -> OrtedCommand:
    """The orted that `words` (what mpirun gave its agent after the host) start, or
    RefusedCommandError. The result is run without a shell: [the worker's orted, *options]."""
    segments = _segments(_tokens(words))
    *setup, command = segments
    if any(not segment for segment in setup):
        raise RefusedCommandError("an empty command between ';'")
    prefix = _prefix(setup)
    if not command:
        raise RefusedCommandError("no command after the prefix")
    program, *options = command
    allowed = {ORTED} if prefix is None else {ORTED, f"{prefix}/bin/{ORTED}"}
    if program not in allowed:
        raise RefusedCommandError(f"{program!r} is not OpenMPI's orted")
    return OrtedCommand(_options(options), prefix)


# orte_hnp_uri: "<jobid>.<vpid>;tcp://<ip>[,<ip>...]:<port>[;tcp6://[<ip6>][,...]:<port>]"
# (OpenMPI 4.1 oob/tcp's contact info): where mpirun listens for its daemons' call-back.
_HNP_URI_KEY = "orte_hnp_uri"
_TCP_CONTACT = re.compile(r"tcp6?://(?P<addresses>[^;]+):(?P<port>\d+)")


def hnp_addresses(options: Sequence[str]) -> frozenset[tuple[str, int]]:
    """The (address, port) pairs of mpirun's call-back socket, from orted's `-mca orte_hnp_uri`
    option (empty when there is none): an orted has called back once it holds an established
    TCP connection to one of them."""
    values = [
        options[index + 2]
        for index in range(len(options) - 2)
        if options[index] == "-mca" and options[index + 1] == _HNP_URI_KEY
    ]
    found: set[tuple[str, int]] = set()
    for value in values:
        for contact in value.split(";")[1:]:
            match = _TCP_CONTACT.fullmatch(contact)
            if match is None:
                continue
            port = int(match.group("port"))
            for address in match.group("addresses").split(","):
                found.add((address.strip("[]"), port))
    return frozenset(found)

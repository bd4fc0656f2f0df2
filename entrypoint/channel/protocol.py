"""The coordination channel's protocol: framing, authentication, messages, verdict rules.

Pure functions and small state machines only (no sockets, no clock): `coordination.py` is the
shell that moves these bytes. Independent of mpirun: any launcher (mpirun over ssh, or every host
running its own processes) uses the same channel to say "I am here", "my part ended with code N"
and, from the master, "the job's verdict is N".

One TCP connection per worker, opened by the worker to the master:

    master -> worker   Challenge: 16 random bytes (the only unauthenticated frame)
    worker -> master   Hello {host, version}             \
    master -> worker   Refused {reason} (another version) |
    both ways          Heartbeat every HEARTBEAT_INTERVAL_S  |  authenticated with the
    master -> worker   Start (every worker said Hello)    |  connection's session key
    worker -> master   Fault {failure}                    |
    worker -> master   Exited {code, failure}             |  (a failure: {reason,
    master -> worker   Verdict {code, failure}            |   message, host} or null)
    worker -> master   Ack                               /
    master -> worker   Restart {attempt}: end this attempt's ranks; Restarted {attempt} back;
                       the next attempt starts on the next Start
    both ways          Request {id, body} -> Response {id, body | error}
    worker -> master   RankReport {samples, errors} every REPORT_INTERVAL_S, and when a rank's
                       output ended on an error line (the stall rule, the failure's last error)
    master -> worker   Request DumpStacks {why} -> StacksDumped {stacks} (a stall)

Frame: 4-byte big-endian length, then a 32-byte HMAC-SHA256 tag, then a JSON object. The tag
covers the direction, the frame's sequence number in that direction and the JSON bytes, under a
session key derived from the job key and both sides' nonces. So a frame cannot be forged without
the job's secret, replayed on another connection, replayed or reordered on the same one, or
reflected back to its sender.

Each message type is a frozen dataclass that owns its JSON (`to_json`/`from_json`) and says which
way it may travel (`TRAVELS`); a `Catalog` maps wire names to types. Adding a message is a
dataclass here (or wherever it is used) plus a handler on the side that receives it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import json
import struct
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from entrypoint.stall import Frame, RankSample
from smcommon.failure import Failure, Reason

# Sent in every Hello; a master refuses a worker that speaks another version. 2: Hello carries
# the version; Refused, Request and Response exist. 3: Stop. 4: Fault; the failure reasons
# OutOfMemory and DiskFull. 5: RankReport, DumpStacks, StacksDumped; the reason Stalled.
# 6: Ping, Pong. 7: StacksDumped's strings table; a RankReport of any number of ranks, its
# errors over several reports where one frame cannot hold them; Restart, Restarted.
PROTOCOL_VERSION = 7
# What a Hello without a version field is: the first protocol, which sent none.
_UNVERSIONED = 1
NONCE_BYTES = 16
TAG_BYTES = 32
_LENGTH = struct.Struct(">I")
# Failure lines are capped at 1024 characters (failure.MESSAGE_LIMIT); the larger messages
# (RankReport, StacksDumped) fit themselves within MESSAGE_BUDGET, so anything over this size
# is not a message of ours.
MAX_FRAME_BYTES = 16 * 1024
# What a message's JSON may take: the frame less its tag, and room for the Response or Request
# that may carry it (its type, id and error fields).
MESSAGE_BUDGET = MAX_FRAME_BYTES - 32 - 256
_KEY_SALT = b"sm-horovod coordination v1"


class ProtocolError(ValueError):
    """A peer sent something that is not a valid, authentic frame: drop the connection."""


class OversizedMessageError(ValueError):
    """A message this side was about to send does not fit in a frame (nothing was sent: the
    session and its sequence numbers are as they were)."""


class Direction(enum.Enum):
    """Who sent a frame; part of every tag, so a frame cannot be reflected to its sender."""

    TO_WORKER = b"M"
    TO_MASTER = b"W"


BOTH_WAYS = frozenset(Direction)

# --------------------------------------------------------------------------------------------
# Keys


def derive_job_key(seed: bytes) -> bytes:
    """The job's channel key from its secret (the same seed as the ssh keys, another purpose)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_KEY_SALT, info=b"channel").derive(seed)


def session_key(job_key: bytes, master_nonce: bytes, worker_nonce: bytes) -> bytes:
    """One key per connection: a frame recorded on one connection is useless on another."""
    if len(master_nonce) != NONCE_BYTES or len(worker_nonce) != NONCE_BYTES:
        raise ProtocolError("nonces must be 16 bytes")
    return hmac.digest(job_key, b"session" + master_nonce + worker_nonce, hashlib.sha256)


# --------------------------------------------------------------------------------------------
# Messages

Fields = dict[str, Any]


class Message:
    """A message of the channel. Subclasses are frozen dataclasses with a wire name (`TYPE`), the
    directions they may travel (`TRAVELS`), and their own JSON: `to_json` gives the fields (the
    encoder adds "type"), `from_json` checks and converts them back."""

    TYPE: ClassVar[str]
    TRAVELS: ClassVar[frozenset[Direction]]
    # Every subclass is a dataclass (dataclasses.fields reads this).
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_json(self) -> Fields:
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    @classmethod
    def check_fields(cls, fields: Fields) -> None:
        """No field the type does not have: a peer speaking another dialect is refused."""
        expected = {field.name for field in dataclasses.fields(cls)}
        if not set(fields) <= expected:
            unexpected = sorted(set(fields) - expected)
            raise ProtocolError(f"unexpected fields {unexpected} in {cls.__name__}")

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        """The default for a message without fields (`catalog` is for messages that carry
        messages)."""
        return cls()

    def travels(self, direction: Direction) -> bool:
        return direction in self.TRAVELS

    def parts(self, budget: int = MESSAGE_BUDGET) -> tuple[Message, ...]:
        """The messages that say this one within `budget` bytes of JSON each (a message whose
        size is bounded by its fields' caps: itself)."""
        return (self,)


Catalog = Mapping[str, type[Message]]


def _exit_code(value: object) -> int:
    # bool is an int in Python; a JSON `true` is not an exit code.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
        raise ProtocolError(f"exit code {value!r} is not an integer in 0..255")
    return value


def _optional_text(value: object, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"{name} must be a string or null")
    return value


_FAILURE_FIELDS = frozenset({"reason", "message", "host"})


def _failure_to_json(failure: Failure | None) -> Fields | None:
    if failure is None:
        return None
    return {"reason": failure.reason.value, "message": failure.message, "host": failure.host}


def _failure(value: object) -> Failure | None:
    """A failure's fields: a reason of the closed set, a message, the host it happened on."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != _FAILURE_FIELDS:
        raise ProtocolError(f"a failure must be null or an object of {sorted(_FAILURE_FIELDS)}")
    try:
        reason = Reason(value["reason"])
    except ValueError:
        raise ProtocolError(f"unknown failure reason {value['reason']!r}") from None
    message = value["message"]
    if not isinstance(message, str):
        raise ProtocolError("a failure's message must be a string")
    return Failure(reason, message, _optional_text(value["host"], "a failure's host"))


def _outcome(fields: Fields) -> tuple[int, Failure | None]:
    """An Exited's or a Verdict's fields: an exit code and an optional failure."""
    return _exit_code(fields.get("exit_code")), _failure(fields.get("failure"))


def _integer(value: object, what: str, minimum: int) -> int:
    """`value` as a JSON integer of at least `minimum` (bool is no integer here)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "non-negative" if minimum == 0 else "positive"
        raise ProtocolError(f"{what} {value!r} is not a {kind} integer")
    return value


def _request_id(value: object) -> int:
    return _integer(value, "request id", 0)


@dataclasses.dataclass(frozen=True)
class Hello(Message):
    """A worker's first authenticated frame: which host it is and which protocol version it
    speaks (its nonce travels in clear in front of it, see hello_frame)."""

    TYPE = "hello"
    TRAVELS = frozenset({Direction.TO_MASTER})

    host: str
    version: int = PROTOCOL_VERSION

    @classmethod
    def check_fields(cls, fields: Fields) -> None:
        # Another version's Hello may have other fields: it is refused for its version, by name.
        if fields.get("version", _UNVERSIONED) == PROTOCOL_VERSION:
            super().check_fields(fields)

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        version = fields.get("version", _UNVERSIONED)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ProtocolError(f"Hello with protocol version {version!r}")
        host = fields.get("host")
        if version != PROTOCOL_VERSION:
            return cls(host if isinstance(host, str) else "", version)
        if not isinstance(host, str) or not host:
            raise ProtocolError("Hello without a host name")
        return cls(host, version)


def version_refusal(hello: Hello) -> str | None:
    """Why a Hello's version cannot be served (one line naming both versions), or None."""
    if hello.version == PROTOCOL_VERSION:
        return None
    return (
        f"protocol version {hello.version} on {hello.host or 'the worker'}, "
        f"{PROTOCOL_VERSION} on the master"
    )


@dataclasses.dataclass(frozen=True)
class Refused(Message):
    """The master will not serve this connection (it speaks another protocol version)."""

    TYPE = "refused"
    TRAVELS = frozenset({Direction.TO_WORKER})

    reason: str

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        reason = fields.get("reason")
        if not isinstance(reason, str):
            raise ProtocolError("Refused without a reason")
        return cls(reason)


@dataclasses.dataclass(frozen=True)
class Heartbeat(Message):
    """I am alive; sent every HEARTBEAT_INTERVAL_S in both directions."""

    TYPE = "heartbeat"
    TRAVELS = BOTH_WAYS


@dataclasses.dataclass(frozen=True)
class Start(Message):
    """The master's go: every worker is connected (and ready for the launcher)."""

    TYPE = "start"
    TRAVELS = frozenset({Direction.TO_WORKER})


@dataclasses.dataclass(frozen=True)
class Stop(Message):
    """The job is stopping (SIGTERM on some host: StopTrainingJob, a spot interruption, docker
    stop): a worker that got it tells the master, the master tells every worker, and every host
    forwards SIGTERM to its own ranks, which get the grace period to checkpoint. A spot
    interruption may reach one host first; its ranks alone could not finish a collective."""

    TYPE = "stop"
    TRAVELS = BOTH_WAYS


@dataclasses.dataclass(frozen=True)
class _Outcome(Message):
    """How something ended: an exit code and, for a failure, its Failure (reason, message,
    host) as three JSON fields."""

    exit_code: int
    failure: Failure | None = None

    def to_json(self) -> Fields:
        return {"exit_code": self.exit_code, "failure": _failure_to_json(self.failure)}

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        return cls(*_outcome(fields))


@dataclasses.dataclass(frozen=True)
class Exited(_Outcome):
    """A worker's local part of the job ended (where every host runs its own processes)."""

    TYPE = "exited"
    TRAVELS = frozenset({Direction.TO_MASTER})


@dataclasses.dataclass(frozen=True)
class Verdict(_Outcome):
    """The job's outcome, decided by the master: every host exits with `exit_code`, and records
    `failure` where there is one."""

    TYPE = "verdict"
    TRAVELS = frozenset({Direction.TO_WORKER})


@dataclasses.dataclass(frozen=True)
class Fault(Message):
    """A worker saw a fault that no process of the job can report itself (the kernel's OOM
    killer ended one of its ranks): sent at once, while mpirun, which only sees the rank's
    exit, is still ending the job; the master's failure prefers it (with_fault)."""

    TYPE = "fault"
    TRAVELS = frozenset({Direction.TO_MASTER})

    failure: Failure

    def to_json(self) -> Fields:
        return {"failure": _failure_to_json(self.failure)}

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        failure = _failure(fields.get("failure"))
        if failure is None:
            raise ProtocolError("a Fault carries a failure")
        return cls(failure)


@dataclasses.dataclass(frozen=True)
class Ping(Message):
    """Master to worker, as a Request, once mpirun failed: are you there, and what did you see?
    The worker checks for a fault first and sends it before its Pong, so when the answer
    arrives the master knows the worker is alive and every fault it has (one round trip,
    instead of waiting for a loss or a fault that may still come)."""

    TYPE = "ping"
    TRAVELS = frozenset({Direction.TO_WORKER})


@dataclasses.dataclass(frozen=True)
class Pong(Message):
    """The answer to a Ping: alive, and any fault already sent."""

    TYPE = "pong"
    TRAVELS = frozenset({Direction.TO_MASTER})


@dataclasses.dataclass(frozen=True)
class Ack(Message):
    """The worker has the verdict; the master may exit."""

    TYPE = "ack"
    TRAVELS = frozenset({Direction.TO_MASTER})


def _attempt(value: object) -> int:
    return _integer(value, "attempt", 1)


@dataclasses.dataclass(frozen=True)
class Restart(Message):
    """Master to worker: a fault a restart cures (restarts.py) ended this attempt: end every
    rank here (SIGTERM, the stop's grace, then SIGKILL), answer Restarted, and start attempt
    `attempt` on the master's next Start."""

    TYPE = "restart"
    TRAVELS = frozenset({Direction.TO_WORKER})

    attempt: int

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        return cls(_attempt(fields.get("attempt")))


@dataclasses.dataclass(frozen=True)
class Restarted(Message):
    """Worker to master: this host's ranks of the last attempt are gone; ready for `attempt`.
    Anything the worker sent of the last attempt (Exited, Fault) came before it."""

    TYPE = "restarted"
    TRAVELS = frozenset({Direction.TO_MASTER})

    attempt: int

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        return cls(_attempt(fields.get("attempt")))


# How often a worker reports its ranks' activity (the stall rule ages each report meanwhile).
REPORT_INTERVAL_S = 5.0
# A report's and a stack summary's text fields are cut here.
_LINE_CHARS = 300
_FRAMES_PER_RANK = 4
# StacksDumped's shapes, richest first: (frames per rank, characters per text field); the
# first whose JSON fits the budget is sent. A file keeps its path's end (the library and the
# file's name), the other fields their start.
_STACK_SHAPES = (
    (_FRAMES_PER_RANK, _LINE_CHARS),
    (_FRAMES_PER_RANK, 120),
    (_FRAMES_PER_RANK, 60),
    (3, 48),
    (2, 48),
    (2, 32),
    (1, 32),
    (1, 16),
    (0, 0),
)


def _number(value: object, name: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise ProtocolError(f"{name} {value!r} is not a non-negative number")
    return float(value)


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{name} must be a string")
    return value[:_LINE_CHARS]


def _list(value: object, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError(f"{name} must be a list")
    return value


def json_size(fields: Fields) -> int:
    """The bytes `fields` take on the wire (non-ASCII escaped as JSON escapes it: 6 or 12 bytes
    a character)."""
    return len(json.dumps(fields, sort_keys=True, separators=(",", ":")))


@dataclasses.dataclass(frozen=True)
class RankReport(Message):
    """Worker to master: this host's live ranks as the stall rule needs them (its host is the
    session's peer), and the last error line of ranks whose output ended since the last report.
    Every rank's sample is in every report; errors that one frame cannot hold go over several
    reports (`parts`), each with every sample again, so the master's view of the host is whole
    after each.
    """

    TYPE = "rank_report"
    TRAVELS = frozenset({Direction.TO_MASTER})

    samples: tuple[RankSample, ...] = ()
    # (rank label, its last error line)
    errors: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> Fields:
        return {
            "samples": [
                [
                    sample.label[:_LINE_CHARS],
                    round(sample.quiet_s, 3),
                    round(sample.idle_s, 3),
                    sample.stopped,
                    sample.said,
                    round(sample.helper_share, 4),
                ]
                for sample in self.samples
            ],
            "errors": [[label[:_LINE_CHARS], line[:_LINE_CHARS]] for label, line in self.errors],
        }

    def parts(self, budget: int = MESSAGE_BUDGET) -> tuple[Message, ...]:
        """Every error, in order, over as few reports as hold them within `budget` (each with
        every sample). Samples alone over the budget (some 400 ranks on one host) are one report
        that the sender refuses, as any message that does not fit."""
        empty = dataclasses.replace(self, errors=())
        room = budget - json_size(message_to_object(empty))
        if not self.errors or room <= 0:
            return (self,)
        reports: list[Message] = []
        batch: list[tuple[str, str]] = []
        used = 0
        for label, line in self.errors:
            # An error's JSON, and the comma before it.
            size = json_size({"": [label[:_LINE_CHARS], line[:_LINE_CHARS]]}) - 4
            if batch and used + size > room:
                reports.append(dataclasses.replace(self, errors=tuple(batch)))
                batch, used = [], 0
            batch.append((label, line))
            used += size
        reports.append(dataclasses.replace(self, errors=tuple(batch)))
        return tuple(reports)

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        samples = []
        for item in _list(fields.get("samples", []), "RankReport's samples"):
            if (
                not isinstance(item, list)
                or len(item) != 6
                or not isinstance(item[3], bool)
                or not isinstance(item[4], bool)
            ):
                raise ProtocolError(
                    "a sample is [label, quiet_s, idle_s, stopped, said, helper_share]"
                )
            samples.append(
                RankSample(
                    host="",
                    label=_text(item[0], "a sample's label"),
                    quiet_s=_number(item[1], "quiet_s"),
                    idle_s=_number(item[2], "idle_s"),
                    stopped=item[3],
                    said=item[4],
                    helper_share=_number(item[5], "helper_share"),
                )
            )
        errors = []
        for item in _list(fields.get("errors", []), "RankReport's errors"):
            if not isinstance(item, list) or len(item) != 2:
                raise ProtocolError("an error is [label, line]")
            errors.append((_text(item[0], "an error's label"), _text(item[1], "an error line")))
        return cls(tuple(samples), tuple(errors))


@dataclasses.dataclass(frozen=True)
class DumpStacks(Message):
    """Master to worker, as a Request's body: write every rank's stack into your log; answered
    with StacksDumped."""

    TYPE = "dump_stacks"
    TRAVELS = frozenset({Direction.TO_WORKER})

    why: str

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        return cls(_text(fields.get("why"), "DumpStacks' why"))


class _Strings:
    """A message's table of distinct strings: ranks waiting in the same place share their
    frames' text, so each is sent once."""

    def __init__(self) -> None:
        self.table: list[str] = []
        self._index: dict[str, int] = {}

    def ref(self, text: str) -> int:
        if text not in self._index:
            self._index[text] = len(self.table)
            self.table.append(text)
        return self._index[text]


def _stacks_json(
    stacks: tuple[tuple[str, tuple[Frame, ...]], ...], frames: int, chars: int
) -> Fields:
    strings = _Strings()
    encoded = [
        [
            strings.ref(name[:_LINE_CHARS]),
            [
                [
                    strings.ref(frame.function[:chars]),
                    # The path's end: the library's folders and the file's name.
                    strings.ref(frame.file[-chars:] if chars else ""),
                    frame.line,
                    strings.ref(frame.source[:chars]),
                ]
                for frame in rank_frames[:frames]
            ],
        ]
        for name, rank_frames in stacks
    ]
    return {"strings": strings.table, "stacks": encoded}


@dataclasses.dataclass(frozen=True)
class StacksDumped(Message):
    """Worker to master: each rank's main-thread frames, innermost first (a few), by its name
    ('<host> <label>'), where they could be read. Every rank is sent; its frames are as many
    and as long as fit in one frame beside every other rank's (`_STACK_SHAPES`: ranks waiting
    in the same place cost their text once, so 48 ranks of one host usually keep 4 frames of
    300 characters)."""

    TYPE = "stacks_dumped"
    TRAVELS = frozenset({Direction.TO_MASTER})

    stacks: tuple[tuple[str, tuple[Frame, ...]], ...] = ()

    @classmethod
    def check_fields(cls, fields: Fields) -> None:
        if not set(fields) <= {"stacks", "strings"}:
            unexpected = sorted(set(fields) - {"stacks", "strings"})
            raise ProtocolError(f"unexpected fields {unexpected} in {cls.__name__}")

    def to_json(self) -> Fields:
        def size(fields: Fields) -> int:
            return json_size({"type": self.TYPE, **fields})

        fields: Fields = {}
        for frames, chars in _STACK_SHAPES:
            fields = _stacks_json(self.stacks, frames, chars)
            if size(fields) <= MESSAGE_BUDGET:
                return fields
        # Names alone over the budget (hundreds of ranks on one host): the first ranks that fit;
        # the master names the others from their samples alone, as ranks py-spy could not read.
        count = len(self.stacks)
        while size(fields) > MESSAGE_BUDGET:
            count = min(count - 1, count * MESSAGE_BUDGET // size(fields))
            fields = _stacks_json(self.stacks[:count], 0, 0)
        return fields

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        table = _list(fields.get("strings", []), "StacksDumped's strings")
        strings = [_text(text, "a string") for text in table]

        def string(value: object) -> str:
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not 0 <= value < len(strings)
            ):
                raise ProtocolError(f"string {value!r} is not in the table")
            return strings[value]

        stacks = []
        for item in _list(fields.get("stacks", []), "StacksDumped's stacks"):
            if not isinstance(item, list) or len(item) != 2:
                raise ProtocolError("a stack is [name, frames]")
            frames = []
            for frame in _list(item[1], "a stack's frames"):
                if not isinstance(frame, list) or len(frame) != 4:
                    raise ProtocolError("a frame is [function, file, line, source]")
                line = frame[2]
                if not isinstance(line, int) or isinstance(line, bool):
                    raise ProtocolError("a frame's line must be an integer")
                frames.append(Frame(string(frame[0]), string(frame[1]), line, string(frame[3])))
            stacks.append((string(item[0]), tuple(frames)))
        return cls(tuple(stacks))


def _body_from_json(value: object, catalog: Catalog) -> Message:
    if not isinstance(value, dict):
        raise ProtocolError("a request's or response's body must be a JSON object")
    body = message_from_fields(dict(value), catalog)
    if isinstance(body, Request | Response):
        raise ProtocolError(f"a {type(body).__name__} cannot be the body of another")
    return body


@dataclasses.dataclass(frozen=True)
class Request(Message):
    """Asks the peer something: its handler for the body's type answers with a Response of the
    same id. Either side may ask; the body must be allowed in the request's direction."""

    TYPE = "request"
    TRAVELS = BOTH_WAYS

    request_id: int
    body: Message

    def to_json(self) -> Fields:
        return {"request_id": self.request_id, "body": message_to_object(self.body)}

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        return cls(
            _request_id(fields.get("request_id")), _body_from_json(fields.get("body"), catalog)
        )

    def travels(self, direction: Direction) -> bool:
        return super().travels(direction) and self.body.travels(direction)


@dataclasses.dataclass(frozen=True)
class Response(Message):
    """The answer to the Request with the same id: a message, or why there is none."""

    TYPE = "response"
    TRAVELS = BOTH_WAYS

    request_id: int
    body: Message | None = None
    error: str | None = None

    def to_json(self) -> Fields:
        body = None if self.body is None else message_to_object(self.body)
        return {"request_id": self.request_id, "body": body, "error": self.error}

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        request_id = _request_id(fields.get("request_id"))
        error = _optional_text(fields.get("error"), "error")
        raw = fields.get("body")
        if (raw is None) == (error is None):
            raise ProtocolError("a Response carries either a body or an error")
        return cls(request_id, None if raw is None else _body_from_json(raw, catalog), error)

    def travels(self, direction: Direction) -> bool:
        return super().travels(direction) and (self.body is None or self.body.travels(direction))


def catalog(*types: type[Message]) -> dict[str, type[Message]]:
    """A wire-name table for these message types (each name once)."""
    table: dict[str, type[Message]] = {}
    for kind in types:
        if kind.TYPE in table:
            raise ValueError(f"two message types named {kind.TYPE!r}")
        table[kind.TYPE] = kind
    return table


# Every message of the channel itself; a feature that adds messages extends this table.
MESSAGES: tuple[type[Message], ...] = (
    Hello, Refused, Heartbeat, Start, Stop, Fault, Exited, Verdict, Ack, Request, Response,
    RankReport, DumpStacks, StacksDumped, Ping, Pong,
    Restart, Restarted,
)  # fmt: skip
CATALOG: Catalog = catalog(*MESSAGES)


def message_to_object(message: Message) -> Fields:
    return {"type": message.TYPE, **message.to_json()}


def message_to_json(message: Message) -> bytes:
    return json.dumps(message_to_object(message), sort_keys=True, separators=(",", ":")).encode()


def message_from_fields(body: Fields, catalog: Catalog = CATALOG) -> Message:
    name = body.pop("type", None)
    kind = catalog.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ProtocolError("unknown message type")
    kind.check_fields(body)
    return kind.from_json(body, catalog)


def message_from_json(data: bytes, catalog: Catalog = CATALOG) -> Message:
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise ProtocolError(f"malformed JSON ({error})") from None
    if not isinstance(body, dict):
        raise ProtocolError("a message must be a JSON object")
    return message_from_fields(body, catalog)


# --------------------------------------------------------------------------------------------
# Frames


def _tag(key: bytes, direction: Direction, sequence: int, payload: bytes) -> bytes:
    header = direction.value + sequence.to_bytes(8, "big")
    return hmac.digest(key, header + payload, hashlib.sha256)


def challenge_frame(nonce: bytes) -> bytes:
    """The master's first frame: its nonce, unauthenticated (a forged one only yields a session
    key that the real master does not share, so the worker's Hello fails there)."""
    return _LENGTH.pack(len(nonce)) + nonce


def hello_frame(key: bytes, worker_nonce: bytes, hello: Hello) -> bytes:
    """The worker's first frame: its nonce in clear (the master needs it to derive the session
    key), then the Hello authenticated under that key as sequence 0."""
    payload = message_to_json(hello)
    body = worker_nonce + _tag(key, Direction.TO_MASTER, 0, payload) + payload
    return _LENGTH.pack(len(body)) + body


class FrameWriter:
    """Encodes one direction's frames with consecutive sequence numbers."""

    def __init__(self, key: bytes, direction: Direction, first_sequence: int = 0) -> None:
        self._key = key
        self._direction = direction
        self._sequence = first_sequence

    def encode(self, message: Message) -> bytes:
        """The message's frame; OversizedMessageError (and no sequence number used) where it would
        exceed MAX_FRAME_BYTES, which the peer would refuse by dropping the session."""
        payload = message_to_json(message)
        if TAG_BYTES + len(payload) > MAX_FRAME_BYTES:
            body = getattr(message, "body", None)
            kind = type(body if isinstance(body, Message) else message).__name__
            raise OversizedMessageError(
                f"a {kind} of {TAG_BYTES + len(payload)} bytes exceeds {MAX_FRAME_BYTES}"
            )
        tag = _tag(self._key, self._direction, self._sequence, payload)
        self._sequence += 1
        return _LENGTH.pack(TAG_BYTES + len(payload)) + tag + payload


HEADER_BYTES = _LENGTH.size


def body_length(header: bytes) -> int:
    """The length a frame header announces; refused above MAX_FRAME_BYTES before anything is
    buffered, so a peer cannot make us hold megabytes."""
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return length


class FrameReader:
    """Checks and decodes one direction's frame bodies: tag, sequence, message type, direction."""

    def __init__(
        self,
        key: bytes,
        direction: Direction,
        first_sequence: int = 0,
        catalog: Catalog = CATALOG,
    ) -> None:
        self._key = key
        self._direction = direction
        self._sequence = first_sequence
        self._catalog = catalog

    def decode(self, body: bytes) -> Message:
        if len(body) <= TAG_BYTES:
            raise ProtocolError("frame too short")
        tag, payload = body[:TAG_BYTES], body[TAG_BYTES:]
        expected = _tag(self._key, self._direction, self._sequence, payload)
        if not hmac.compare_digest(tag, expected):
            raise ProtocolError("authentication failed (wrong key, replayed or reordered frame)")
        self._sequence += 1
        message = message_from_json(payload, self._catalog)
        if not message.travels(self._direction):
            raise ProtocolError(f"{type(message).__name__} is not allowed in this direction")
        return message


def parse_challenge(body: bytes) -> bytes:
    if len(body) != NONCE_BYTES:
        raise ProtocolError("the master's challenge must be 16 bytes")
    return body


def parse_hello(job_key: bytes, master_nonce: bytes, body: bytes) -> tuple[Hello, bytes]:
    """The master's check of a worker's first frame; returns the Hello and the session key.
    The Hello's version is not checked here (see version_refusal): a worker of another version
    is authenticated first, then refused by name."""
    if len(body) <= NONCE_BYTES + TAG_BYTES:
        raise ProtocolError("Hello frame too short")
    worker_nonce, rest = body[:NONCE_BYTES], body[NONCE_BYTES:]
    key = session_key(job_key, master_nonce, worker_nonce)
    message = FrameReader(key, Direction.TO_MASTER).decode(rest)
    if not isinstance(message, Hello):
        raise ProtocolError(f"expected Hello, got {type(message).__name__}")
    return message, key

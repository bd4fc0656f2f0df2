"""The coordination channel's protocol: framing, authentication, messages, verdict rules.

Pure functions and small state machines only (no sockets, no clock): `coordination.py` is the
shell that moves these bytes. Independent of mpirun: any launcher (mpirun over ssh, or every host
running its own processes) uses the same channel to say "I am here", "my part ended with code N"
and, from the master, "the job's verdict is N".

One TCP connection per worker, opened by the worker to the master:

    master -> worker   Challenge: 16 random bytes (the only unauthenticated frame)
    worker -> master   Hello {host}                      \
    both ways          Heartbeat every HEARTBEAT_INTERVAL_S  |  authenticated with the
    master -> worker   Start (every worker said Hello)    |  connection's session key
    worker -> master   Exited {code, failure}             |  (a failure: {reason,
    master -> worker   Verdict {code, failure}            |   message, host} or null)
    worker -> master   Ack                               /

Frame: 4-byte big-endian length, then a 32-byte HMAC-SHA256 tag, then a JSON object. The tag
covers the direction, the frame's sequence number in that direction and the JSON bytes, under a
session key derived from the job key and both sides' nonces. So a frame cannot be forged without
the job's secret, replayed on another connection, replayed or reordered on the same one, or
reflected back to its sender.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from entrypoint.failure import STOPPED_EXIT_CODE, Failure, Reason

PROTOCOL_VERSION = 1
NONCE_BYTES = 16
TAG_BYTES = 32
_LENGTH = struct.Struct(">I")
# Failure lines are capped at 1024 characters (failure.MESSAGE_LIMIT); anything near this size
# is not a message of ours.
MAX_FRAME_BYTES = 16 * 1024
_KEY_SALT = b"sm-horovod coordination v1"


class ProtocolError(ValueError):
    """A peer sent something that is not a valid, authentic frame: drop the connection."""


class Direction(enum.Enum):
    """Who sent a frame; part of every tag, so a frame cannot be reflected to its sender."""

    TO_WORKER = b"M"
    TO_MASTER = b"W"


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


@dataclasses.dataclass(frozen=True)
class Hello:
    """A worker's first authenticated frame: which host it is (its nonce travels in clear in
    front of it, see hello_frame)."""

    host: str


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """I am alive; sent every HEARTBEAT_INTERVAL_S in both directions."""


@dataclasses.dataclass(frozen=True)
class Start:
    """The master's go: every worker is connected (and ready for the launcher)."""


@dataclasses.dataclass(frozen=True)
class Exited:
    """A worker's local part of the job ended (launchers where every host runs processes)."""

    exit_code: int
    failure: Failure | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The job's outcome, decided by the master: every host exits with `exit_code`, and records
    `failure` where there is one."""

    exit_code: int
    failure: Failure | None = None


@dataclasses.dataclass(frozen=True)
class Ack:
    """The worker has the verdict; the master may exit."""


Message = Hello | Heartbeat | Start | Exited | Verdict | Ack

_TYPES: dict[str, type[Message]] = {
    "hello": Hello,
    "heartbeat": Heartbeat,
    "start": Start,
    "exited": Exited,
    "verdict": Verdict,
    "ack": Ack,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}
# What each side may receive: a worker never gets to send a Verdict, a master never a Hello.
ALLOWED = {
    Direction.TO_MASTER: frozenset({Hello, Heartbeat, Exited, Ack}),
    Direction.TO_WORKER: frozenset({Heartbeat, Start, Verdict}),
}


def _failure_to_json(failure: Failure | None) -> dict[str, Any] | None:
    if failure is None:
        return None
    return {"reason": failure.reason.value, "message": failure.message, "host": failure.host}


def message_to_json(message: Message) -> bytes:
    body: dict[str, Any] = {"type": _NAMES[type(message)], **dataclasses.asdict(message)}
    if isinstance(message, Exited | Verdict):
        body["failure"] = _failure_to_json(message.failure)
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


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


def message_from_json(data: bytes) -> Message:
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise ProtocolError(f"malformed JSON ({error})") from None
    if not isinstance(body, dict):
        raise ProtocolError("a message must be a JSON object")
    kind = _TYPES.get(body.pop("type", None))
    if kind is None:
        raise ProtocolError("unknown message type")
    expected = {field.name for field in dataclasses.fields(kind)}
    if not set(body) <= expected:
        raise ProtocolError(f"unexpected fields {sorted(set(body) - expected)} in {kind.__name__}")
    if kind is Hello:
        host = body.get("host")
        if not isinstance(host, str) or not host:
            raise ProtocolError("Hello without a host name")
        return Hello(host)
    if kind in (Exited, Verdict):
        return kind(_exit_code(body.get("exit_code")), _failure(body.get("failure")))
    return kind()


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
        payload = message_to_json(message)
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
    """Checks and decodes one direction's frame bodies: tag, sequence, message type."""

    def __init__(self, key: bytes, direction: Direction, first_sequence: int = 0) -> None:
        self._key = key
        self._direction = direction
        self._sequence = first_sequence

    def decode(self, body: bytes) -> Message:
        if len(body) <= TAG_BYTES:
            raise ProtocolError("frame too short")
        tag, payload = body[:TAG_BYTES], body[TAG_BYTES:]
        expected = _tag(self._key, self._direction, self._sequence, payload)
        if not hmac.compare_digest(tag, expected):
            raise ProtocolError("authentication failed (wrong key, replayed or reordered frame)")
        self._sequence += 1
        message = message_from_json(payload)
        if type(message) not in ALLOWED[self._direction]:
            raise ProtocolError(f"{type(message).__name__} is not allowed in this direction")
        return message


def parse_challenge(body: bytes) -> bytes:
    if len(body) != NONCE_BYTES:
        raise ProtocolError("the master's challenge must be 16 bytes")
    return body


def parse_hello(job_key: bytes, master_nonce: bytes, body: bytes) -> tuple[Hello, bytes]:
    """The master's check of a worker's first frame; returns the Hello and the session key."""
    if len(body) <= NONCE_BYTES + TAG_BYTES:
        raise ProtocolError("Hello frame too short")
    worker_nonce, rest = body[:NONCE_BYTES], body[NONCE_BYTES:]
    key = session_key(job_key, master_nonce, worker_nonce)
    message = FrameReader(key, Direction.TO_MASTER).decode(rest)
    if not isinstance(message, Hello):
        raise ProtocolError(f"expected Hello, got {type(message).__name__}")
    return message, key


# --------------------------------------------------------------------------------------------
# Liveness and verdict rules


def silent_peers(last_heard: Mapping[str, float], now: float, lost_after_s: float) -> list[str]:
    """Peers not heard from for `lost_after_s` (a host cut off the network sends no FIN)."""
    return sorted(host for host, heard in last_heard.items() if now - heard >= lost_after_s)


def suspect_peers(silences: Mapping[str, float], suspect_after_s: float) -> list[str]:
    """Peers silent for `suspect_after_s` or more, most silent first: not lost on silence alone,
    but the explanation when something else failed at the same time (mpirun lost a daemon)."""
    suspects = [host for host, silent in silences.items() if silent >= suspect_after_s]
    return sorted(suspects, key=lambda host: (-silences[host], host))


def first_decisive(
    codes: Mapping[str, int | None], order: Sequence[str], chief: str | None = None
) -> tuple[str | None, int] | None:
    """The rule shared by a host's tasks and by the job's hosts: the first failure in `order`
    decides (name, code); else the chief ending with 0 is success (None, 0); else everyone ending
    with 0 is; else nothing is decided yet (None)."""
    for name in order:
        code = codes.get(name)
        if code is not None and code != 0:
            return name, code
    if chief is not None and codes.get(chief) == 0:
        return None, 0
    if all(codes.get(name) == 0 for name in order):
        return None, 0
    return None


def host_verdict(
    hosts: tuple[str, ...],
    exits: Mapping[str, Exited],
    *,
    chief: str | None = None,
    stopping: bool = False,
) -> Verdict | None:
    """Where every host reports how its part ended. None while undecided.

    - Stopping (SIGTERM): every part gets its grace period to checkpoint, so nothing is decided
      before every host's part ended; then the job was stopped (143), whatever the codes.
    - Otherwise the first failure (in host order) fails the job at once, with that host's
      failure; success needs every host's part to have ended with 0, or, with a `chief`,
      the chief host's part (tf.distribute's parameter servers: the worker and ps servers block
      in server.join() forever and are stopped by the entry points).
    """
    if stopping:
        if all(host in exits for host in hosts):
            return Verdict(STOPPED_EXIT_CODE, Failure(Reason.STOPPED, "stopped by SIGTERM"))
        return None
    codes = {host: result.exit_code for host, result in exits.items()}
    decisive = first_decisive(codes, hosts, chief)
    if decisive is None:
        return None
    host, code = decisive
    if host is None:
        return Verdict(0)
    failure = exits[host].failure or Failure(
        Reason.TRAINING_FAILED, f"the program exited with code {code}", host
    )
    return Verdict(code, failure)


def per_host_verdict(
    hosts: tuple[str, ...], exits: Mapping[str, Exited], *, stopping: bool = False
) -> Verdict | None:
    """Every host's part counts alike (host_verdict without a chief)."""
    return host_verdict(hosts, exits, stopping=stopping)


def chief_verdict(
    hosts: tuple[str, ...],
    exits: Mapping[str, Exited],
    chief_host: str,
    *,
    stopping: bool = False,
) -> Verdict | None:
    """The chief host's success ends the job (host_verdict with a chief)."""
    return host_verdict(hosts, exits, chief=chief_host, stopping=stopping)

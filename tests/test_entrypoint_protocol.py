"""Unit tests of the coordination protocol: framing, authentication, messages, verdict rules."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from entrypoint.channel.protocol import (
    CATALOG,
    MAX_FRAME_BYTES,
    MESSAGES,
    NONCE_BYTES,
    PROTOCOL_VERSION,
    TAG_BYTES,
    Ack,
    Direction,
    Exited,
    Fault,
    FrameReader,
    FrameWriter,
    Heartbeat,
    Hello,
    Message,
    Ping,
    Pong,
    ProtocolError,
    Refused,
    Request,
    Response,
    Start,
    Verdict,
    body_length,
    catalog,
    challenge_frame,
    derive_job_key,
    hello_frame,
    message_from_json,
    message_to_json,
    parse_challenge,
    parse_hello,
    session_key,
    version_refusal,
)
from entrypoint.channel.verdicts import host_verdict, silent_peers, suspect_peers, with_fault
from smcommon.failure import Failure, Reason, parse_failure

JOB_KEY = derive_job_key(b"job secret")
MASTER_NONCE = bytes(range(16))
WORKER_NONCE = bytes(range(16, 32))
KEY = session_key(JOB_KEY, MASTER_NONCE, WORKER_NONCE)


def body(frame: bytes) -> bytes:
    """A frame without its length header, checking the header on the way."""
    assert body_length(frame[:4]) == len(frame) - 4
    return frame[4:]


def test_keys_are_deterministic_and_separate():
    assert derive_job_key(b"job secret") == JOB_KEY
    assert derive_job_key(b"other secret") != JOB_KEY
    assert len(JOB_KEY) == 32
    assert session_key(JOB_KEY, MASTER_NONCE, WORKER_NONCE) == KEY
    assert session_key(JOB_KEY, WORKER_NONCE, MASTER_NONCE) != KEY
    with pytest.raises(ProtocolError, match="16 bytes"):
        session_key(JOB_KEY, b"short", WORKER_NONCE)


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (Hello("algo-2"), b'{"host":"algo-2","type":"hello","version":7}'),
        (Heartbeat(), b'{"type":"heartbeat"}'),
        (Start(), b'{"type":"start"}'),
        (Exited(3, Failure(Reason.TRAINING_FAILED, "x", "algo-2")),
         b'{"exit_code":3,"failure":{"host":"algo-2","message":"x","reason":"TrainingFailed"},'
         b'"type":"exited"}'),
        (Verdict(143, Failure(Reason.STOPPED, "stopped by SIGTERM")),
         b'{"exit_code":143,"failure":{"host":null,"message":"stopped by SIGTERM",'
         b'"reason":"Stopped"},"type":"verdict"}'),
        (Verdict(0), b'{"exit_code":0,"failure":null,"type":"verdict"}'),
        (Ack(), b'{"type":"ack"}'),
        (Fault(Failure(Reason.OUT_OF_MEMORY, "the kernel's OOM killer ended a process", "algo-2")),
         b'{"failure":{"host":"algo-2","message":"the kernel\'s OOM killer ended a process",'
         b'"reason":"OutOfMemory"},"type":"fault"}'),
        (Refused("protocol version 1 on algo-2, 6 on the master"),
         b'{"reason":"protocol version 1 on algo-2, 6 on the master","type":"refused"}'),
        (Request(7, Heartbeat()), b'{"body":{"type":"heartbeat"},"request_id":7,"type":"request"}'),
        (Request(8, Ping()), b'{"body":{"type":"ping"},"request_id":8,"type":"request"}'),
        (Response(8, Pong()),
         b'{"body":{"type":"pong"},"error":null,"request_id":8,"type":"response"}'),
        (Response(7, Exited(0)),
         b'{"body":{"exit_code":0,"failure":null,"type":"exited"},"error":null,"request_id":7,'
         b'"type":"response"}'),
        (Response(8, None, "no handler for Start"),
         b'{"body":null,"error":"no handler for Start","request_id":8,"type":"response"}'),
    ],
)  # fmt: skip
def test_messages_as_exact_json(message, text):
    assert message_to_json(message) == text
    assert message_from_json(text) == message


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (b"{not json", "malformed JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"type":"launch"}', "unknown message type"),
        (b'{"exit_code":0}', "unknown message type"),
        (b'{"type":"hello","version":7}', "Hello without a host name"),
        (b'{"type":"hello","host":"","version":7}', "Hello without a host name"),
        (b'{"type":"hello","host":"a","version":true}', "Hello with protocol version True"),
        (b'{"type":"hello","host":"a","version":7,"x":1}', "unexpected fields \\['x'\\] in Hello"),
        (b'{"type":"verdict","exit_code":true}', "exit code True is not an integer"),
        (b'{"type":"verdict","exit_code":256}', "exit code 256"),
        (b'{"type":"verdict","exit_code":"0"}', "exit code '0'"),
        (b'{"type":"verdict","exit_code":1,"failure":5}', "a failure must be null or an object"),
        (
            b'{"type":"verdict","exit_code":1,"failure":{"reason":"Oops","message":"m","host":null}}',
            "unknown failure reason 'Oops'",
        ),
        (
            b'{"type":"exited","exit_code":1,"failure":{"reason":"Stopped","message":1,"host":null}}',
            "message must be a string",
        ),
        (b'{"type":"ack","extra":1}', "unexpected fields \\['extra'\\] in Ack"),
        (b"\xff\xfe", "malformed JSON"),
        (b'{"type":"request","request_id":-1,"body":{"type":"ack"}}', "request id -1"),
        (b'{"type":"request","request_id":1,"body":[]}', "body must be a JSON object"),
        (b'{"type":"request","request_id":1,"body":{"type":"launch"}}', "unknown message type"),
        (b'{"type":"request","request_id":1,"body":{"type":"request","request_id":2,'
         b'"body":{"type":"ack"}}}', "a Request cannot be the body of another"),
        (b'{"type":"response","request_id":1,"body":null,"error":null}', "either a body or"),
        (b'{"type":"response","request_id":1,"body":{"type":"ack"},"error":"x"}', "either a body"),
        (b'{"type":"refused"}', "Refused without a reason"),
    ],
)  # fmt: skip
def test_malformed_messages_are_refused(text, error):
    with pytest.raises(ProtocolError, match=error):
        message_from_json(text)


def test_frames_round_trip_in_sequence():
    writer = FrameWriter(KEY, Direction.TO_WORKER)
    reader = FrameReader(KEY, Direction.TO_WORKER)
    frames = [
        writer.encode(m) for m in (Heartbeat(), Start(), Verdict(1, Failure(Reason.HOST_LOST, "x")))
    ]
    assert [reader.decode(body(frame)) for frame in frames] == [
        Heartbeat(),
        Start(),
        Verdict(1, Failure(Reason.HOST_LOST, "x")),
    ]
    # length header, 32-byte tag, then the JSON
    assert frames[0][4 + TAG_BYTES :] == b'{"type":"heartbeat"}'
    assert struct.unpack(">I", frames[0][:4]) == (TAG_BYTES + 20,)


def test_a_forged_frame_is_refused():
    forged = FrameWriter(session_key(derive_job_key(b"guess"), MASTER_NONCE, WORKER_NONCE),
                         Direction.TO_WORKER).encode(Verdict(0))  # fmt: skip
    with pytest.raises(ProtocolError, match="authentication failed"):
        FrameReader(KEY, Direction.TO_WORKER).decode(body(forged))


def test_a_tampered_frame_is_refused():
    frame = bytearray(
        FrameWriter(KEY, Direction.TO_WORKER).encode(Verdict(1, Failure(Reason.HOST_LOST, "x")))
    )
    frame[-10] ^= 1
    with pytest.raises(ProtocolError, match="authentication failed"):
        FrameReader(KEY, Direction.TO_WORKER).decode(body(bytes(frame)))


def test_replayed_and_reordered_frames_are_refused():
    writer = FrameWriter(KEY, Direction.TO_WORKER)
    first, second = writer.encode(Verdict(0)), writer.encode(Heartbeat())
    reader = FrameReader(KEY, Direction.TO_WORKER)
    reader.decode(body(first))
    with pytest.raises(ProtocolError, match="replayed or reordered"):
        reader.decode(body(first))
    with pytest.raises(ProtocolError, match="replayed or reordered"):
        FrameReader(KEY, Direction.TO_WORKER).decode(body(second))


def test_a_frame_from_another_connection_is_refused():
    other = session_key(JOB_KEY, MASTER_NONCE, bytes(16))
    frame = FrameWriter(other, Direction.TO_WORKER).encode(Verdict(0))
    with pytest.raises(ProtocolError, match="authentication failed"):
        FrameReader(KEY, Direction.TO_WORKER).decode(body(frame))


def test_a_reflected_frame_is_refused():
    """A worker's own Heartbeat sent back to it must not pass as the master's."""
    frame = FrameWriter(KEY, Direction.TO_MASTER).encode(Heartbeat())
    with pytest.raises(ProtocolError, match="authentication failed"):
        FrameReader(KEY, Direction.TO_WORKER).decode(body(frame))


@pytest.mark.parametrize(
    ("direction", "message"),
    [(Direction.TO_MASTER, Verdict(0)), (Direction.TO_MASTER, Start()),
     (Direction.TO_WORKER, Hello("algo-1")), (Direction.TO_WORKER, Exited(0))],
)  # fmt: skip
def test_messages_only_travel_their_way(direction, message):
    """A worker can never send a verdict, nor the master a Hello, even with the right key."""
    frame = FrameWriter(KEY, direction).encode(message)
    with pytest.raises(ProtocolError, match="not allowed in this direction"):
        FrameReader(KEY, direction).decode(body(frame))


@pytest.mark.parametrize(
    ("direction", "message", "allowed"),
    [(Direction.TO_MASTER, Request(0, Verdict(0)), False),
     (Direction.TO_WORKER, Request(0, Start()), True),
     (Direction.TO_WORKER, Response(0, Exited(0)), False),
     (Direction.TO_MASTER, Response(0, Exited(0)), True),
     (Direction.TO_MASTER, Response(0, None, "failed"), True),
     (Direction.TO_WORKER, Refused("x"), True),
     (Direction.TO_MASTER, Refused("x"), False)],
)  # fmt: skip
def test_requests_and_responses_carry_only_what_may_travel_their_way(direction, message, allowed):
    """A request or response is no way around the direction rule: its body must be allowed in
    the direction it travels, so a worker cannot have the master 'answer' itself a Verdict."""
    frame = FrameWriter(KEY, direction).encode(message)
    if allowed:
        assert FrameReader(KEY, direction).decode(body(frame)) == message
    else:
        with pytest.raises(ProtocolError, match="not allowed in this direction"):
            FrameReader(KEY, direction).decode(body(frame))


def test_a_message_type_is_known_only_to_its_catalog():
    @dataclasses.dataclass(frozen=True)
    class Spawn(Message):
        TYPE = "spawn"
        TRAVELS = frozenset({Direction.TO_WORKER})

    frame = FrameWriter(KEY, Direction.TO_WORKER).encode(Request(1, Spawn()))
    with pytest.raises(ProtocolError, match="unknown message type"):
        FrameReader(KEY, Direction.TO_WORKER).decode(body(frame))
    extended = catalog(*MESSAGES, Spawn)
    decoded = FrameReader(KEY, Direction.TO_WORKER, catalog=extended).decode(body(frame))
    assert decoded == Request(1, Spawn())
    with pytest.raises(ValueError, match="two message types named 'ack'"):
        catalog(*MESSAGES, Ack)
    assert set(CATALOG) == {kind.TYPE for kind in MESSAGES}


@pytest.mark.parametrize(
    ("text", "hello", "refusal"),
    [
        (b'{"host":"algo-2","type":"hello","version":7}', Hello("algo-2", 7), None),
        # the first protocol sent no version
        (b'{"host":"algo-2","type":"hello"}', Hello("algo-2", 1),
         "protocol version 1 on algo-2, 7 on the master"),
        # a later version may say more, or less: it is refused for its version, by name
        (b'{"host":"algo-2","type":"hello","version":8,"rank":0}', Hello("algo-2", 8),
         "protocol version 8 on algo-2, 7 on the master"),
        (b'{"type":"hello","version":8}', Hello("", 8),
         "protocol version 8 on the worker, 7 on the master"),
    ],
)  # fmt: skip
def test_hello_carries_the_protocol_version(text, hello, refusal):
    assert PROTOCOL_VERSION == 7
    decoded = message_from_json(text)
    assert isinstance(decoded, Hello)
    assert decoded == hello
    assert version_refusal(decoded) == refusal


def test_oversized_and_short_frames_are_refused():
    with pytest.raises(ProtocolError, match=f"exceeds {MAX_FRAME_BYTES}"):
        body_length(struct.pack(">I", MAX_FRAME_BYTES + 1))
    assert body_length(struct.pack(">I", MAX_FRAME_BYTES)) == MAX_FRAME_BYTES
    with pytest.raises(ProtocolError, match="too short"):
        FrameReader(KEY, Direction.TO_WORKER).decode(b"x" * TAG_BYTES)


def test_handshake():
    assert parse_challenge(body(challenge_frame(MASTER_NONCE))) == MASTER_NONCE
    with pytest.raises(ProtocolError, match="16 bytes"):
        parse_challenge(b"x" * 15)
    frame = hello_frame(KEY, WORKER_NONCE, Hello("algo-3"))
    assert body(frame)[:NONCE_BYTES] == WORKER_NONCE
    hello, key = parse_hello(JOB_KEY, MASTER_NONCE, body(frame))
    assert (hello, key) == (Hello("algo-3"), KEY)
    # The session continues at sequence 1 on both ends.
    follow = FrameWriter(KEY, Direction.TO_MASTER, first_sequence=1).encode(Exited(0))
    assert FrameReader(key, Direction.TO_MASTER, first_sequence=1).decode(body(follow)) == Exited(0)


def test_a_hello_from_another_job_or_challenge_is_refused():
    frame = body(hello_frame(KEY, WORKER_NONCE, Hello("algo-3")))
    with pytest.raises(ProtocolError, match="authentication failed"):
        parse_hello(derive_job_key(b"another job"), MASTER_NONCE, frame)
    # A Hello recorded on one connection, replayed to a new challenge.
    with pytest.raises(ProtocolError, match="authentication failed"):
        parse_hello(JOB_KEY, bytes(16), frame)
    with pytest.raises(ProtocolError, match="too short"):
        parse_hello(JOB_KEY, MASTER_NONCE, frame[: NONCE_BYTES + TAG_BYTES])
    not_hello = WORKER_NONCE + body(FrameWriter(KEY, Direction.TO_MASTER).encode(Heartbeat()))
    with pytest.raises(ProtocolError, match="expected Hello, got Heartbeat"):
        parse_hello(JOB_KEY, MASTER_NONCE, not_hello)


def test_silent_peers():
    heard = {"algo-2": 100.0, "algo-3": 95.0, "algo-4": 80.0}
    assert silent_peers(heard, now=100.0, lost_after_s=20.0) == ["algo-4"]
    assert silent_peers(heard, now=115.0, lost_after_s=20.0) == ["algo-3", "algo-4"]
    assert silent_peers({}, now=0.0, lost_after_s=1.0) == []


def test_suspect_peers_most_silent_first():
    silences = {"algo-2": 0.4, "algo-3": 9.5, "algo-4": 3.0, "algo-5": 9.5}
    assert suspect_peers(silences, suspect_after_s=3.0) == ["algo-3", "algo-5", "algo-4"]
    assert suspect_peers(silences, suspect_after_s=10.0) == []


HOSTS = ("algo-1", "algo-2", "algo-3")


@pytest.mark.parametrize(
    ("exits", "stopping", "verdict"),
    [
        ({}, False, None),
        ({"algo-1": Exited(0), "algo-2": Exited(0)}, False, None),
        ({"algo-1": Exited(0), "algo-2": Exited(0), "algo-3": Exited(0)}, False, Verdict(0)),
        ({"algo-3": Exited(2, Failure(Reason.TRAINING_FAILED, "boom", "algo-3"))}, False,
         Verdict(2, Failure(Reason.TRAINING_FAILED, "boom", "algo-3"))),
        ({"algo-2": Exited(1)}, False,
         Verdict(1, Failure(Reason.TRAINING_FAILED, "the program exited with code 1", "algo-2"))),
        # the first failing host in host order names the failure
        ({"algo-3": Exited(3, Failure(Reason.TRAINING_FAILED, "c")),
          "algo-2": Exited(2, Failure(Reason.TRAINING_FAILED, "b"))},
         False, Verdict(2, Failure(Reason.TRAINING_FAILED, "b"))),
        # stopping: every part gets its grace period, then the job was stopped
        ({"algo-1": Exited(143), "algo-2": Exited(143)}, True, None),
        ({"algo-1": Exited(143), "algo-2": Exited(0), "algo-3": Exited(143)}, True,
         Verdict(143, Failure(Reason.STOPPED, "stopped by SIGTERM"))),
    ],
)  # fmt: skip
def test_per_host_verdict(exits, stopping, verdict):
    assert host_verdict(HOSTS, exits, stopping=stopping) == verdict


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("HostLost: host algo-2 lost (on algo-1)",
         (Reason.HOST_LOST, "host algo-2 lost (on algo-1)")),
        ("Stopped: stopped by SIGTERM", (Reason.STOPPED, "stopped by SIGTERM")),
        ("Segmentation fault", (Reason.TRAINING_FAILED, "Segmentation fault")),
        ("", (Reason.TRAINING_FAILED, "failed without a reason")),
    ],
)  # fmt: skip
def test_parse_failure(line, parsed):
    assert parse_failure(line) == parsed


# --------------------------------------------------------------------------------------------
# Faults


def test_a_fault_carries_a_failure_and_travels_to_the_master_only():
    with pytest.raises(ProtocolError, match="a Fault carries a failure"):
        message_from_json(b'{"type":"fault","failure":null}')
    fault = Fault(Failure(Reason.OUT_OF_MEMORY, "oom", "algo-2"))
    assert fault.travels(Direction.TO_MASTER)
    assert not fault.travels(Direction.TO_WORKER)


OOM_ON_2 = Failure(
    Reason.OUT_OF_MEMORY,
    "the kernel's OOM killer ended a process of the job (the container's memory limit is 512 MiB)",
    "algo-2",
)
OOM_ON_3 = dataclasses.replace(OOM_ON_2, host="algo-3")
MPIRUN_FAILED = Failure(
    Reason.TRAINING_FAILED,
    "mpirun exited with code 137; last error: rank 2: killed",
    "algo-1",
)


def test_a_fault_explains_the_failure_the_launcher_saw():
    assert with_fault(MPIRUN_FAILED, {"algo-2": OOM_ON_2}, HOSTS).line == (
        "OutOfMemory: the kernel's OOM killer ended a process of the job "
        "(the container's memory limit is 512 MiB); then: mpirun exited with code 137; "
        "last error: rank 2: killed (on algo-2)"
    )


def test_the_first_host_in_order_with_a_fault_explains_it():
    faults = {"algo-3": OOM_ON_3, "algo-2": OOM_ON_2}
    assert with_fault(MPIRUN_FAILED, faults, ("algo-1", "algo-2", "algo-3")).host == "algo-2"


def test_no_fault_a_stop_or_a_fault_itself_stays_as_it_is():
    assert with_fault(MPIRUN_FAILED, {}, HOSTS) is MPIRUN_FAILED
    stopped = Failure(Reason.STOPPED, "stopped by SIGTERM", "algo-1")
    assert with_fault(stopped, {"algo-2": OOM_ON_2}, HOSTS) is stopped
    assert with_fault(OOM_ON_3, {"algo-2": OOM_ON_2}, HOSTS) is OOM_ON_3

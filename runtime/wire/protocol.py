"""The coordinator <-> worker protocol: message types, their fields, and the checks every received message
passes before it is acted on.

Sockets (W = a worker, C = the coordinator):
  W binds a ROUTER on its --listen address (control). C connects one DEALER per worker; everything between
  C and that worker (the session set-up, fragment files, per-request commands, model inputs and outputs)
  travels on that connection, so C binds nothing and needs no open port.
  For a run, W binds a PULL (data) on the same host (port --data-port, or any free one) when some other
  device sends it tensors; each W connects a PUSH to every device it sends to. Tensors go device to device.
  With keys, every one of these sockets is CURVE: W is the server on its ROUTER and its PULL, C and the
  sending workers are clients, and W accepts only clients whose public key is in its keys folder; on its
  ROUTER, only the coordinator's key (public/coordinator.key, keys.py "Roles"): a hello from another key is
  refused (code "role") and anything else from it dropped.

A session (one run), in order:
  C hello {protocol, edgec}            -> W welcome {protocol, edgec, pid, threads, cores, key, providers}
                                          (providers: the worker's ort.get_available_providers(); the coordinator
                                          refuses the run if a provider the plan gives the device is not there)
                                          or refused {code: "version" | "busy" | "role", reason, protocol}
  C open {device, manifest (its JSON), path (for messages), inflight, emulate, compress, dilate}
                                       -> W opened {data_port, need: [sha256 of fragments not in its cache]}
  C blob {sha256, offset, size} + bytes (chunks, at most BLOB_WINDOW unacknowledged)
                                       -> W ack {sha256, offset}; W loaded {} once its fragments are loaded
  C peers {peers: {device: {addr, key}}} -> W ready {}  (W connected to the devices it sends to)
  C sync {seq}                         -> W synced {seq, clock}  (optional, only once ready, repeatable: the
                                          worker's time.monotonic() for the coordinator's clock offset estimate;
                                          a session that received one times every request, see `done`)
  per request: C tensor (model inputs, src "@host"), C run {req, slow} -> W tensor (model outputs),
                                          W done {req, run_ms, frag_ms, run_clocks, clocks}
                                          (a worker keeps a request's tensors that arrive before its `run`, inside
                                          the in-flight window, so either order works; the coordinator sends the
                                          inputs first)
  under emulate (device/emulate.py, coordinator/emulate.py):
    W channel {seq, ms, since_ms}      -> C grant {seq, wait_ms}  (shared medium only: W's next burst of sends
                                          takes ms and was ready since_ms ago; C reserves the one channel, first
                                          come first served, from then or when it is free, and W starts the
                                          burst wait_ms after the grant arrives: negative when it started then)
    `run`'s slow (1 outside emulation, where a worker refuses anything else) pads this request's fragment
    runs to slow x predicted_ms x dilate: a device that slows down mid-run (`edgec run --emulate --slow`)
    W overrun {req, fragments, measured_ms}  (before that request's `done`, when some of its fragment runs took
                                          longer than predicted_ms x dilate: the fragments and their run times)
  a generative build's sequences (manifest version 2; device/sequences.py):
    C begin {seq, temperature, seed, logits, drawn}
                                       (opens sequence seq, an int >= 0 never used before in the session, with
                                          every state input of the device's fragments empty; the device that
                                          gives the logits chooses each token: greedy at temperature 0, else
                                          drawn with a generator seeded (seed, seq, token number), the first
                                          token chosen being number `drawn`: 0, or the tokens a sequence
                                          restarted on a fallback plan already has; device/choose.py)
    W tensor TOKEN_TENSOR              (per step, from the device that gives the logits: the chosen token id,
                                          int64 [1], in place of the logits, which it sends too only when
                                          `begin` asked for them with logits true, for --verify)
    C run {req, slow, seq, next_req?, token_from?}
                                       (a step of sequence seq: the device's fragments read the sequence's state
                                          and keep their state outputs as its next step's inputs; the caches never
                                          leave the worker. `seq` is required in a generative session, refused
                                          in any other, as are next_req and token_from.
                                          next_req: the request of the sequence's next step, absent on its last:
                                          the device that gives the logits sends the token it chooses, besides
                                          TOKEN_TENSOR to C, on the data sockets to every device that takes it as
                                          a model input (the generate block's token feed), as that input, keyed
                                          by next_req (to itself, straight into its inbox): the token's direct
                                          path, last stage -> first stage. next_req > req, and less than the
                                          window past it (the receiver must keep it).
                                          token_from: the device the step's token input comes from, the one
                                          that gives the logits; C sends the step's other inputs but not that
                                          one, and the receiving device's recv step from the host waits for
                                          (req, token_from, input) instead)
    C drop {seq}                       (frees the sequence's state; sent once its last step is `done` on every
                                          worker: begin and drop act when they arrive, runs when their turn comes)
  C ping {} (keeps the session alive while C is idle); C end {} -> W bye {stats}
  W error {kind: "input" | "run" | "stopped", req, message} at any point ends the session ("stopped": the worker
  is shutting down, e.g. SIGTERM; the coordinator treats its device as lost and fails over).
Request ids count from 0 in steps of 1; at most `inflight` requests are open at once, and a worker keeps
tensors only for the requests inside that window.

`done` timings (runtime/coordinator/accuracy.py reads them): empty lists until the session received a `sync`; then
frag_ms holds one entry per `run` step of the device, in step order (the fragment's run time in ms, padded
under --emulate), run_clocks one per frag_ms entry (the worker's time.monotonic() in seconds when that run
started: just before the executor ran it, or under --emulate the start the emulation counts the padded run
from), and clocks one per device-to-device `send` and `recv` step, in step order (the worker's
time.monotonic() in seconds when the send started, before compression; when the whole tensor message was
taken off the data socket, for a recv; a token input that came from the device that chose it is a recv from
the host in the steps, so not timed). A device with more than MAX_TIMED_STEPS such steps cannot be timed
(its `done` would outgrow MAX_HEADER_BYTES). A generative session's `bye` stats count the token's direct path
too: tokens_sent (by the chooser, to a next step's input) and tokens_received (token inputs taken from it).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable, Iterator

import zmq

from ..manifest.types import HOST, Recv, Run, Send, Step
from .transport import MAX_HEADER_BYTES, BadMessage, unpack

__all__ = ["PROTOCOL_VERSION", "TOKEN_TENSOR", "MAX_TEMPERATURE", "welcome_providers", "BLOB_CHUNK", "BLOB_WINDOW", "MAX_OPEN_BYTES", "MAX_TIMED_STEPS", "MAX_DILATE",
           "is_timed", "timed_steps", "parse", "DropLog"]

logger = logging.getLogger(__name__)

# Bumped whenever a message or its meaning changes; both ends must speak the same version.
# 2: tensors may be compressed (the run's `compress` mode, in `open`).
# 3: error kind "stopped" (the worker is shutting down: its device is lost); `sync`/`synced` (the worker's clock)
#    and the per-request timings in `done` (frag_ms, clocks) for `edgec run --report`; `open`'s `dilate` (--emulate
#    --dilate K), the shared medium's `channel`/`grant` and emulation `overrun`s.
# 4: `done` carries run_clocks, the start of each fragment run (the measured timeline of `edgec run --trace`).
# 5: `run` carries slow, the emulated slow-down of the request's fragment runs (`edgec run --emulate --slow`).
# 6: `welcome` carries providers, the onnxruntime execution providers the worker has (checked after the version,
#    so that a worker of version 5 is told about the version, not about a missing field).
# 7: a generative session's sequences: `begin`, `drop` and `run`'s seq (a worker of 6 would run a generative
#    build's steps without their caches).
# 8: `begin` carries drawn, the tokens the sequence already has (restarted on a fallback plan mid-generation),
#    and sampling seeds each token's draw by (seed, seq, token number) (a worker of 7 would draw other tokens).
# 9: `run` carries next_req and token_from: the token travels from the device that chooses it to the first
#    stage directly, and the coordinator issues a sequence's next step before its token is known (a worker of 8
#    would wait for a token input the coordinator no longer sends).
PROTOCOL_VERSION = 9
TOKEN_TENSOR = "@token"  # a generative step's chosen token id, sent to the coordinator in place of the logits
BLOB_CHUNK = 4 << 20  # fragment file bytes per blob message
BLOB_WINDOW = 4  # blob messages in flight per worker: bounds what either side queues
MAX_OPEN_BYTES = (64 << 20) + (1 << 16)  # the manifest (at most 64 MiB, manifest/load.py) and the other fields
MAX_TEMPERATURE = 1e6  # `begin`'s temperature: beyond it every token is as likely, so a larger one is a mistake
MAX_DILATE = 1000.0  # --dilate: a 100 ms fragment then pads to 100 s, past any sensible --timeout
# msgpack writes a float in 9 bytes, and a timed step costs a `done` at most two (a run: its start and its
# time): this many timed steps keep a `done` header well inside MAX_HEADER_BYTES. Which steps are timed, and in
# what order `done` lists them: is_timed, timed_steps.
MAX_TIMED_STEPS = (MAX_HEADER_BYTES - 4096) // (2 * 9)


def is_timed(step: Step) -> bool:
    """Whether a worker times the step: a run, or a send or recv between devices (the host's are not)."""
    return isinstance(step, Run) or (isinstance(step, Send) and step.to != HOST) or \
        (isinstance(step, Recv) and step.src != HOST)


def timed_steps(steps: Iterable[Step]) -> Iterator[tuple[str, str, str]]:
    """The steps a worker times, in order: ("run", fragment, ""), ("send", to, name as received),
    ("recv", from, name)."""
    for step in filter(is_timed, steps):
        if isinstance(step, Run):
            yield "run", step.fragment, ""
        elif isinstance(step, Send):
            yield "send", step.to, step.name
        else:
            yield "recv", step.src, step.tensor


_INT, _STR, _BIN, _BOOL, _NUM = int, str, bytes, bool, float
_FIELDS: dict[str, dict[str, tuple]] = {
    # coordinator -> worker
    "hello": {"protocol": (_INT,), "edgec": (_STR,)},
    "open": {"device": (_STR,), "manifest": (_BIN,), "path": (_STR,), "inflight": (_INT,), "emulate": (_BOOL,),
             "compress": (_STR,), "dilate": (_NUM, _INT)},
    "blob": {"sha256": (_STR,), "offset": (_INT,), "size": (_INT,)},
    "peers": {"peers": (dict,)},
    "run": {"req": (_INT,), "slow": (_NUM, _INT)},
    "sync": {"seq": (_INT,)},
    "begin": {"seq": (_INT,), "temperature": (_NUM, _INT), "seed": (_INT,), "logits": (_BOOL,), "drawn": (_INT,)},
    "drop": {"seq": (_INT,)},
    "grant": {"seq": (_INT,), "wait_ms": (_NUM, _INT)},
    "ping": {},
    "end": {},
    # worker -> coordinator
    "welcome": {"protocol": (_INT,), "edgec": (_STR,), "pid": (_INT,), "threads": (_INT,), "cores": (_INT,),
                "key": (_STR, type(None))},
    "refused": {"code": (_STR,), "reason": (_STR,), "protocol": (_INT,)},
    "opened": {"data_port": (_INT, type(None)), "need": (list,)},
    "ack": {"sha256": (_STR,), "offset": (_INT,)},
    "loaded": {},
    "ready": {},
    "synced": {"seq": (_INT,), "clock": (_NUM,)},
    "done": {"req": (_INT,), "run_ms": (_NUM, _INT), "frag_ms": (list,), "run_clocks": (list,), "clocks": (list,)},
    "error": {"kind": (_STR,), "req": (_INT,), "message": (_STR,)},
    "channel": {"seq": (_INT,), "ms": (_NUM, _INT), "since_ms": (_NUM, _INT)},
    "overrun": {"req": (_INT,), "fragments": (list,), "measured_ms": (list,)},
    "bye": {"stats": (dict,)},
    # either way (checked in full by transport.decode_tensor)
    "tensor": {},
}
_PAYLOAD = {"blob", "tensor"}  # the types followed by a payload frame


def parse(frames: list[zmq.Frame], allowed: frozenset[str] | set[str]) -> tuple[dict, zmq.Frame | None]:
    """(header, payload frame or None) of a received message whose type is in `allowed`; BadMessage for
    anything else: wrong frame count, oversized or non-msgpack header, unknown type, missing or mistyped field."""
    if not 1 <= len(frames) <= 2:
        raise BadMessage(f"{len(frames)} frames")
    head = frames[0].buffer
    limit = MAX_OPEN_BYTES if "open" in allowed else MAX_HEADER_BYTES
    msg = unpack(head, limit)
    if not isinstance(msg, dict):
        raise BadMessage(f"header is a {type(msg).__name__}, not a map")
    kind = msg.get("t")
    if not isinstance(kind, str) or kind not in allowed:
        raise BadMessage(f"unexpected message type {str(kind)[:40]!r}")
    if kind != "open" and len(head) > MAX_HEADER_BYTES:
        raise BadMessage(f"{kind}: header of {len(head)} bytes")
    for key, types in _FIELDS[kind].items():
        value = msg.get(key, _MISSING)
        if value is _MISSING or not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise BadMessage(f"{kind}: field {key!r} missing or not {'/'.join(t.__name__ for t in types)}")
    for key in _FINITE.get(kind, ()):
        _check_numbers(kind, key, msg[key], *_RANGE.get(kind, {}).get(key, (-math.inf, math.inf)))
    if kind in ("begin", "drop") or (kind == "run" and "seq" in msg):
        _check_seq(kind, msg.get("seq"))
    if kind == "run":
        _check_token_fields(msg)
    if kind == "begin" and not 0 <= msg["seed"] < 1 << 63:
        raise BadMessage(f"begin: field 'seed' holds {msg['seed']!r}, outside [0, 2**63)")
    if kind == "begin" and not 0 <= msg["drawn"] < 1 << 31:
        raise BadMessage(f"begin: field 'drawn' holds {msg['drawn']!r}, outside [0, 2**31)")
    if kind == "overrun":
        _check_overrun(msg)
    if kind == "done":
        _check_done(msg)
    has_payload = len(frames) == 2
    if has_payload != (kind in _PAYLOAD):
        raise BadMessage(f"{kind}: {'unexpected' if has_payload else 'missing'} payload frame")
    return msg, frames[1] if has_payload else None


_MISSING = object()
# Fields that must hold finite numbers (a number, or a list of them): timings are subtracted and compared,
# and NaN or infinity would reach the report as a figure.
_FINITE = {"run": ("slow",), "synced": ("clock",), "done": ("frag_ms", "run_clocks", "clocks"), "open": ("dilate",),
           "grant": ("wait_ms",), "begin": ("temperature",), "channel": ("ms", "since_ms"), "overrun": ("measured_ms",)}
# Numbers that must also lie in a range (a negative duration would run the emulated clock backwards).
_RANGE = {"run": {"slow": (1.0 / MAX_DILATE, MAX_DILATE)}, "open": {"dilate": (1.0, MAX_DILATE)},
          "channel": {"ms": (0.0, math.inf), "since_ms": (0.0, math.inf)}, "overrun": {"measured_ms": (0.0, math.inf)},
          "begin": {"temperature": (0.0, MAX_TEMPERATURE)}}


def welcome_providers(msg: dict) -> list[str]:
    """The providers a `welcome` of this protocol version lists: a list of at most 64 non-empty strings."""
    providers = msg.get("providers")
    if not isinstance(providers, list) or not 0 < len(providers) <= 64 or \
            not all(isinstance(p, str) and 0 < len(p) <= 128 for p in providers):
        raise BadMessage("welcome: field 'providers' missing or not a list of provider names")
    return providers


def _check_numbers(kind: str, key: str, value: Any, lo: float, hi: float) -> None:
    values = value if isinstance(value, list) else [value]
    if len(values) > MAX_TIMED_STEPS:
        raise BadMessage(f"{kind}: field {key!r} has {len(values)} entries (at most {MAX_TIMED_STEPS})")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise BadMessage(f"{kind}: field {key!r} holds {str(v)[:40]!r}, not a finite number")
        if not lo <= v <= hi:
            raise BadMessage(f"{kind}: field {key!r} holds {v!r}, outside [{lo:g}, {hi:g}]")


def _check_seq(kind: str, seq: Any) -> None:
    """A sequence id: an int from 0 to 2**62 (run's is optional: absent outside a generative session)."""
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 1 << 62:
        raise BadMessage(f"{kind}: field 'seq' holds {str(seq)[:40]!r}, not a sequence id")


def _check_token_fields(msg: dict) -> None:
    """run's optional next_req (a later request id) and token_from (a device name)."""
    nxt = msg.get("next_req", _MISSING)
    if nxt is not _MISSING and (isinstance(nxt, bool) or not isinstance(nxt, int) or not msg["req"] < nxt < 1 << 62):
        raise BadMessage(f"run: field 'next_req' holds {str(nxt)[:40]!r}, not a request after {msg['req']}")
    src = msg.get("token_from", _MISSING)
    if src is not _MISSING and not (isinstance(src, str) and 0 < len(src) <= 128):
        raise BadMessage(f"run: field 'token_from' holds {str(src)[:40]!r}, not a device name")


def _check_overrun(msg: dict) -> None:
    """One fragment id (a string) per measured time."""
    fragments = msg["fragments"]
    if len(fragments) != len(msg["measured_ms"]) or not all(isinstance(f, str) for f in fragments):
        raise BadMessage("overrun: 'fragments' must hold one fragment id per entry of 'measured_ms'")


def _check_done(msg: dict) -> None:
    """One run start per run time."""
    if len(msg["run_clocks"]) != len(msg["frag_ms"]):
        raise BadMessage("done: 'run_clocks' must hold one start per entry of 'frag_ms'")


class DropLog:
    """Counts dropped messages by reason; logs the first few of each reason and then every 1000th as
    warnings (the rest at debug level, shown by `edgec worker --verbose`), so a flood costs a counter
    increment, not a log line."""

    FIRST = 5

    def __init__(self, who: str):
        self.who = who
        self.counts: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def drop(self, reason: str, detail: Any = "") -> None:
        n = self.counts[reason] = self.counts.get(reason, 0) + 1
        level = logging.WARNING if n <= self.FIRST or n % 1000 == 0 else logging.DEBUG
        if logger.isEnabledFor(level):
            logger.log(level, "%s: dropped a message (%s%s)%s", self.who, reason, f": {detail}" if detail else "",
                       f" [{n} so far]" if n > 1 else "")

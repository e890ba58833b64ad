"""The per-request transport path: whole messages received without exceptions, the CURVE credential zmq
queues ahead of a connection's first message, header checks that refuse instead of crashing, and the order in
which the coordinator hands a request to a worker."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.wire.transport import BadMessage, bind_local, recv_message, send_frames, tensor_header


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_recv_message_returns_whole_messages_in_order_then_none(ctx):
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    push.connect(bind_local(pull))
    assert recv_message(pull) is None
    send_frames(push, [b"a", memoryview(b"bc"), np.arange(3, dtype=np.int16)])
    send_frames(push, [b"d"])
    deadline = time.monotonic() + 10.0
    got = []
    while len(got) < 2 and time.monotonic() < deadline:
        frames = recv_message(pull)
        if frames is None:
            time.sleep(0.001)
        else:
            got.append([f.bytes for f in frames])
    assert got == [[b"a", b"bc", np.arange(3, dtype=np.int16).tobytes()], [b"d"]]
    assert recv_message(pull) is None


def test_recv_message_skips_the_curve_credential_queued_ahead_of_a_first_message(ctx):
    """zmq counts a CURVE peer's credential as readable as soon as the header frame of its first message is
    in, and a receive then finds nothing until the payload has arrived: no message yet, not an error (a worker
    took that error for a failed run)."""
    auth = ThreadAuthenticator(ctx)
    auth.start()
    try:
        auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)  # gives the peer a User-Id
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        pull.curve_server, pull.curve_secretkey, pull.curve_publickey = True, server_secret, server_public
        push.curve_serverkey, push.curve_publickey, push.curve_secretkey = server_public, client_public, client_secret
        push.connect(bind_local(pull))
        payload = np.ones(48 << 20, dtype=np.uint8)  # long enough on the wire for the header to arrive alone
        send_frames(push, [b"header", payload])
        deadline = time.monotonic() + 30.0
        frames = None
        while frames is None and time.monotonic() < deadline:
            frames = recv_message(pull)
        assert frames is not None, "the message never arrived"
        assert frames[0].bytes == b"header" and len(frames[1].buffer) == payload.nbytes
        assert frames[1].get("User-Id") == client_public.decode()
    finally:
        auth.stop()


@pytest.mark.parametrize("dtype", [[1], {"a": 1}, 3, None])
def test_a_tensor_header_with_a_dtype_that_is_no_name_is_a_bad_message(dtype):
    header = msgpack.unpackb(msgpack.packb({"t": "tensor", "req": 0, "src": "a", "tensor": "x", "dtype": dtype,
                                           "shape": [1], "codec": "none"}), strict_map_key=False)
    with pytest.raises(BadMessage, match="unknown dtype"):
        tensor_header(header)


def test_the_coordinator_sends_a_request_inputs_before_its_run(chain, ctx):
    """A worker woken by `run` alone would sleep again until the inputs are decrypted: inputs go first."""
    cluster = WorkerPool(load_manifest(chain.write()))
    pull = ctx.socket(zmq.PULL)
    address = bind_local(pull)
    for w in cluster.workers.values():
        w.sock = ctx.socket(zmq.PUSH)
        w.sock.connect(address)
    cluster._issue({"data": np.zeros((1, 3, 8, 8), np.float32)})
    kinds = []
    deadline = time.monotonic() + 10.0
    while len(kinds) < 1 + len(cluster.workers) and time.monotonic() < deadline:
        frames = recv_message(pull)
        if frames is None:
            time.sleep(0.001)
        else:
            kinds.append(msgpack.unpackb(frames[0].bytes)["t"])
    assert kinds == ["tensor"] + ["run"] * len(cluster.workers)

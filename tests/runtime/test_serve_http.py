"""`edgec serve` over HTTP: stock tritonclient gets onnxruntime's outputs (JSON and binary tensors) from a
build served across local workers; every malformed request gets its one-line 400 (404, 413, 401) and the
server goes on; /metrics speaks Prometheus; SIGTERM answers and exits 0; a non-loopback bind needs a token."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from edgec.runtime.front.runall import load_allocation
from tests.runtime.test_run_all import allocation  # noqa: F401 - the fixture: two services, a device each
from tests.runtime.serve_helpers import EDGEC, Server, assert_close, reference
from tests.runtime.serve_helpers import build  # noqa: F401 - the fixture: the chain model, built once per module
from tests.runtime.procs import local_workers


@pytest.fixture(scope="module")
def server(build):
    s = Server(build, "--model-name", "chain", "--inflight", "2")
    yield s
    assert s.stop() == 0, "".join(s.lines)


def _inputs(seed: int) -> dict:
    return {"data": np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)}


def _infer(client, x: dict, binary: bool) -> np.ndarray:
    given = httpclient.InferInput("data", [1, 3, 8, 8], "FP32")
    given.set_data_from_numpy(x["data"], binary_data=binary)
    result = client.infer("chain", [given], outputs=[httpclient.InferRequestedOutput("prob", binary_data=binary)])
    return result.as_numpy("prob")


def test_stock_client_gets_onnxruntime_outputs_json_and_binary(server, build):
    client = httpclient.InferenceServerClient(server.http)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("chain")
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data"]
    meta = client.get_model_metadata("chain")
    assert meta["inputs"] == [{"name": "data", "datatype": "FP32", "shape": [1, 3, 8, 8]}]
    assert meta["outputs"] == [{"name": "prob", "datatype": "FP32", "shape": [1, 10]}]
    for seed, binary in ((0, True), (1, False)):
        x = _inputs(seed)
        assert_close(_infer(client, x, binary), reference(build, x)["prob"])


def test_concurrent_clients_each_get_their_own_answer(server, build):
    def one(seed):
        client = httpclient.InferenceServerClient(server.http)
        return [(_infer(client, _inputs(seed * 10 + i), True), seed * 10 + i) for i in range(5)]

    with ThreadPoolExecutor(4) as pool:
        for results in pool.map(one, range(4)):
            for got, seed in results:
                assert_close(got, reference(build, _inputs(seed))["prob"])


def _post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict | bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if resp.getheader("Content-Type") == "application/json" else data)
    finally:
        conn.close()


@pytest.mark.parametrize("body, headers, status, words", [
    (b"{not json", {}, 400, "malformed JSON"),
    (json.dumps({"inputs": [{"name": "nope", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode(), {}, 400,
     "unknown input 'nope'"),
    (json.dumps({"inputs": [{"name": "data", "shape": [1, 3, 8, 8], "datatype": "INT64", "data": [0] * 192}]}).encode(),
     {}, 400, "datatype 'INT64'"),
    (json.dumps({"inputs": [{"name": "data", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.5] * 100}]}).encode(),
     {}, 400, "100 values"),
    (b'{"inputs":[{"name":"data","shape":[1,3,8,8],"datatype":"FP32","parameters":{"binary_data_size":768}}]}'
     + b"\0" * 100, {"Inference-Header-Content-Length": "100"}, 400, "binary_data_size 768 runs past"),
], ids=["malformed", "unknown-input", "datatype", "short-json-data", "short-binary-data"])
def test_a_bad_request_is_a_one_line_400_and_the_server_goes_on(server, build, body, headers, status, words):
    if "Inference-Header-Content-Length" in headers:  # the real header's length
        head = body[:body.index(b"}]}") + 3]
        headers = {"Inference-Header-Content-Length": str(len(head))}
    code, doc = _post(server, "/v2/models/chain/infer", body, headers)
    assert code == status and set(doc) == {"error"} and words in doc["error"] and "\n" not in doc["error"], doc
    x = _inputs(7)
    assert_close(_infer(httpclient.InferenceServerClient(server.http), x, True), reference(build, x)["prob"])


def test_unknown_model_is_404_and_an_oversized_body_is_refused_unread(server):
    code, doc = _post(server, "/v2/models/nope/infer", b"{}")
    assert code == 404 and "unknown model 'nope'" in doc["error"]
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:  # the headers alone: a server that read the body would wait for 1 GB that never comes
        conn.putrequest("POST", "/v2/models/chain/infer")
        conn.putheader("Content-Length", str(1 << 30))
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 413 and "more than the" in json.loads(resp.read())["error"]
    finally:
        conn.close()
    with pytest.raises(InferenceServerException, match="unknown model"):
        httpclient.InferenceServerClient(server.http).get_model_metadata("nope")


def _raw(server, request: bytes) -> bytes:
    """What the server answers to `request` sent as is, until it closes the connection or 2 s of silence."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(request)
        sock.settimeout(2.0)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
    return answer


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /v2/health/live\r\n\r\n", 400),  # HTTP/0.9: no version
    (b"GET /v2/health/live HTTP/2.0\r\n\r\n", 400),
    (b"GET /v2/health/live HTTP/1.1\r\n no-name\r\n\r\n", 400),  # a folded line
    (b"GET /v2/health/live HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", 431),
    (b"GET /v2/health/live HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n", 431),
], ids=["http-0.9", "http-2", "folded-header", "long-header", "many-headers"])
def test_a_malformed_request_head_is_refused_and_the_server_goes_on(server, request_bytes, status):
    answer = _raw(server, request_bytes)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert set(doc) == {"error"} and "\n" not in doc["error"], doc
    assert _raw(server, b"GET /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200 ")


def test_headers_are_case_blind_keep_alive_holds_and_http_1_0_closes(server):
    ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _raw(server, ready * 2 + b"GET /v2 HTTP/1.1\r\nCONNECTION: Close\r\n\r\n" + ready)
    assert answer.count(b"HTTP/1.1 200 ") == 3 and b'"name":"edgec"' in answer  # the last one after close: none
    assert _raw(server, b"GET /v2/health/live HTTP/1.0\r\n\r\n" + ready).count(b"HTTP/1.1 200 ") == 1
    assert _raw(server, b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + ready
                ).count(b"HTTP/1.1 200 ") == 2
    code, doc = _post(server, "/v2/models/chain/infer", b"{not json", {"content-length": "9"})
    assert code == 400 and "malformed JSON" in doc["error"]


def test_binary_inputs_are_views_of_the_body_not_copies(build):
    from edgec.runtime.manifest.load import load_manifest
    from edgec.runtime.serve.oip import parse_infer

    x = _inputs(3)["data"]
    head = json.dumps({"inputs": [{"name": "data", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    body = head + x.tobytes()
    got = parse_infer(body, len(head), load_manifest(build / "manifest.json")).inputs["data"]
    assert np.array_equal(got, x) and not got.flags.writeable
    assert np.shares_memory(got, np.frombuffer(body, np.uint8))


def test_metrics_count_requests_and_failures_by_kind(server):
    _infer(httpclient.InferenceServerClient(server.http), _inputs(7), True)  # whatever ran before on this server
    _post(server, "/v2/models/chain/infer", b"{bad")
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    assert 'edgec_request_failures_total{kind="invalid",model="chain"}' in text
    answered = [ln for ln in text.splitlines() if ln.startswith('edgec_requests_total{model="chain"}')]
    assert answered and float(answered[0].split()[-1]) >= 1
    for name in ("edgec_request_latency_seconds_bucket", "edgec_queue_depth", "edgec_requests_in_flight",
                 "edgec_device_compute_seconds_total", "edgec_link_bytes_total", "edgec_failovers_total"):
        assert name in text, name


def test_a_token_is_required_when_given_and_off_loopback(build, tmp_path):
    refused = subprocess.run([*EDGEC, "serve", str(build), "--http", "0.0.0.0:0"], capture_output=True, text=True,
                             timeout=60)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and "--token-file" in lines[0], refused.stderr
    token = tmp_path / "token"
    token.write_text("s3cret-token-0123456789\n")
    s = Server(build, "--token-file", str(token), "--model-name", "chain")
    try:
        with pytest.raises(InferenceServerException, match="bearer token"):
            httpclient.InferenceServerClient(s.http).get_model_metadata("chain")
        good = httpclient.InferenceServerClient(s.http)
        meta = good.get_model_metadata("chain", headers={"Authorization": "Bearer s3cret-token-0123456789"})
        assert meta["name"] == "chain"
    finally:
        assert s.stop() == 0


def test_sigterm_answers_what_was_accepted_and_exits_0(build):
    s = Server(build, "--model-name", "chain", "--status-every", "0.5")
    client = httpclient.InferenceServerClient(s.http, concurrency=4)
    x = _inputs(3)
    given = httpclient.InferInput("data", [1, 3, 8, 8], "FP32")
    given.set_data_from_numpy(x["data"])
    pending = [client.async_infer("chain", [given]) for _ in range(8)]
    answered = [p.get_result().as_numpy("prob") for p in pending]
    time.sleep(1.2)  # a status line or two
    assert s.stop() == 0, "".join(s.lines)
    ref = reference(build, x)["prob"]
    for got in answered:
        assert_close(got, ref)
    assert any("stopped" in ln for ln in s.lines) and not any("Traceback" in ln for ln in s.lines)
    status = [ln for ln in s.lines if "request(s) in the last 0.5 s" in ln]
    assert status and all(" p50 " in ln and " p99 " in ln and "error(s)" in ln for ln in status), s.lines



def test_an_allocation_serves_every_service_at_its_own_name(allocation):  # noqa: F811
    """An `edgec allocate` folder: tinychain and tinyconv, each on its own device, each at /v2/models/NAME."""
    services = {svc.name: svc.manifest.parent for svc in load_allocation(allocation).services}
    s = Server(allocation)
    try:
        client = httpclient.InferenceServerClient(s.http)
        assert set(services) == {"chain", "conv"}
        for name, folder in services.items():
            meta = client.get_model_metadata(name)
            given, feed = [], {}
            for t in meta["inputs"]:
                x = np.random.default_rng(0).standard_normal(t["shape"]).astype(np.float32)
                i = httpclient.InferInput(t["name"], t["shape"], t["datatype"])
                i.set_data_from_numpy(x)
                given.append(i)
                feed[t["name"]] = x
            result = client.infer(name, given)
            ref = reference(folder, feed)
            for o in meta["outputs"]:
                assert_close(result.as_numpy(o["name"]), ref[o["name"]])
    finally:
        assert s.stop() == 0, "".join(s.lines)


def test_a_full_queue_is_429_and_a_lost_device_503_naming_it(build):
    s = Server(build, "--model-name", "chain", "--queue", "1", "--inflight", "1", "--heartbeat-ms", "100")
    try:
        x = _inputs(5)
        body = json.dumps({"inputs": [{"name": "data", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                       "data": x["data"].reshape(-1).tolist()}]}).encode()
        seen: set[int] = set()
        with ThreadPoolExecutor(16) as pool:
            for _ in range(20):  # bursts of 16 at a queue of 1: some find it full
                seen |= {code for code, _ in pool.map(lambda _i: _post(s, "/v2/models/chain/infer", body), range(16))}
                if 429 in seen:
                    break
        assert 429 in seen and seen <= {200, 429}, seen
        workers = local_workers(s.proc.pid)
        assert workers
        for pid in workers:  # every local worker: the build has no fallback
            os.kill(pid, signal.SIGKILL)
        code, doc = 0, {}
        for _ in range(100):
            code, doc = _post(s, "/v2/models/chain/infer", body)
            if code == 503:
                break
            time.sleep(0.1)
        assert code == 503 and ("pi5-a" in doc["error"] or "pi4-a" in doc["error"]), doc
        conn = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=30)
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().status == 503
        conn.close()
    finally:
        assert s.stop() == 0, "".join(s.lines)

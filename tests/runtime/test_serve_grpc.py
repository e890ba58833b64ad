"""`edgec serve --grpc`: stock tritonclient.grpc gets onnxruntime's outputs over inference.GRPCInferenceService;
errors carry the protocol's status codes and the server goes on; the .proto keeps the protocol's field numbers
(checked against tritonclient's own descriptors)."""

from __future__ import annotations

import signal

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.utils import InferenceServerException

from edgec.runtime.serve import grpc_service_pb2 as pb
from tests.runtime.serve_helpers import Server, assert_close, reference
from tests.runtime.serve_helpers import build  # noqa: F401 - the fixture: the chain model, built once per module


@pytest.fixture(scope="module")
def server(build):
    s = Server(build, "--grpc", "127.0.0.1:0", "--model-name", "chain")
    yield s
    assert s.stop() == 0, "".join(s.lines)


def _input(array: np.ndarray) -> grpcclient.InferInput:
    given = grpcclient.InferInput("data", list(array.shape), "FP32")
    given.set_data_from_numpy(array)
    return given


@pytest.mark.parametrize("name", ["ServerLiveResponse", "ServerReadyResponse", "ModelReadyRequest",
                                  "ModelReadyResponse", "ServerMetadataResponse", "ModelMetadataRequest",
                                  "ModelMetadataResponse", "ModelInferRequest", "ModelInferResponse",
                                  "InferParameter", "InferTensorContents"])
def test_the_proto_keeps_the_protocols_field_names_and_numbers(name):
    ours, theirs = getattr(pb, name).DESCRIPTOR, getattr(triton_pb, name).DESCRIPTOR
    assert ours.full_name == theirs.full_name
    for field in ours.fields:
        other = theirs.fields_by_name[field.name]
        assert (other.number, other.type, other.is_repeated) == (field.number, field.type, field.is_repeated), field.name


def test_stock_grpc_client_gets_onnxruntime_outputs(server, build):
    client = grpcclient.InferenceServerClient(server.grpc)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("chain")
    assert list(client.get_server_metadata().extensions) == ["binary_tensor_data"]
    meta = client.get_model_metadata("chain")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("data", "FP32", [1, 3, 8, 8])]
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)
        result = client.infer("chain", [_input(x)], outputs=[grpcclient.InferRequestedOutput("prob")])
        assert_close(result.as_numpy("prob"), reference(build, {"data": x})["prob"])


def test_errors_carry_the_protocols_status_codes_and_the_server_goes_on(server, build):
    client = grpcclient.InferenceServerClient(server.grpc)
    x = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("nope", [_input(x)])
    assert unknown.value.status() == str(grpc.StatusCode.NOT_FOUND)
    with pytest.raises(InferenceServerException, match="the model takes") as shape:
        client.infer("chain", [_input(np.zeros((1, 3, 8, 4), np.float32))])
    assert shape.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    wrong = grpcclient.InferInput("data", [1, 3, 8, 8], "INT32")
    wrong.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.int32))
    with pytest.raises(InferenceServerException, match="datatype 'INT32'"):
        client.infer("chain", [wrong])
    assert_close(client.infer("chain", [_input(x)]).as_numpy("prob"), reference(build, {"data": x})["prob"])


def test_a_token_guards_grpc_too_and_sigint_stops_cleanly(build, tmp_path):
    token = tmp_path / "token"
    token.write_text("grpc-token-0123456789abcdef\n")
    s = Server(build, "--grpc", "127.0.0.1:0", "--model-name", "chain", "--token-file", str(token))
    try:
        client = grpcclient.InferenceServerClient(s.grpc)
        with pytest.raises(InferenceServerException, match="bearer token") as refused:
            client.get_model_metadata("chain")
        assert refused.value.status() == str(grpc.StatusCode.UNAUTHENTICATED)
        x = np.ones((1, 3, 8, 8), np.float32)
        result = client.infer("chain", [_input(x)], headers={"authorization": "Bearer grpc-token-0123456789abcdef"})
        assert_close(result.as_numpy("prob"), reference(build, {"data": x})["prob"])
    finally:
        assert s.stop(signal.SIGINT) == 0, "".join(s.lines)

"""The gRPC front of `edgec serve`: inference.GRPCInferenceService (ServerLive, ServerReady, ModelReady,
ServerMetadata, ModelMetadata, ModelInfer) on grpcio, its messages from grpc_service.proto.

Tensors come as `raw_input_contents` (what tritonclient sends) or typed `contents`; outputs go back as
`raw_output_contents`. The handlers are registered by hand (a generic handler) rather than from generated
service stubs: six unary methods, and no second generated file to keep in step.
"""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
import numpy as np

from ..errors import InputError
from . import grpc_service_pb2 as pb
from .front import Failure, Front
from .oip import BadRequest, InferRequest, datatype, decode_tensor, server_metadata

__all__ = ["start_grpc"]

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
_THREADS = 16  # requests handled at once: each blocks on its session Future, the devices bound the rate
# The typed contents field of each datatype (FP16 has none: raw contents only).
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents"}


def start_grpc(host: str, port: int, front: Front, version: str) -> tuple[grpc.Server, int]:
    """The server, started, and the port it bound."""
    limit = max(m.limit for m in front.models.values())
    server = grpc.server(futures.ThreadPoolExecutor(_THREADS, thread_name_prefix="edgec-grpc"),
                         options=[("grpc.max_receive_message_length", limit),
                                  ("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers((_Service(front, version).handler(),))
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:
        raise InputError(f"--grpc {host}:{port}: cannot listen there ({exc})") from None
    if bound == 0:
        raise InputError(f"--grpc {host}:{port}: cannot listen there")
    server.start()
    return server, bound


class _Service:
    def __init__(self, front: Front, version: str):
        self.front, self.version = front, version

    def handler(self) -> grpc.GenericRpcHandler:
        methods = {"ServerLive": (self.live, pb.ServerLiveRequest),
                   "ServerReady": (self.ready, pb.ServerReadyRequest),
                   "ModelReady": (self.model_ready, pb.ModelReadyRequest),
                   "ServerMetadata": (self.server_metadata, pb.ServerMetadataRequest),
                   "ModelMetadata": (self.model_metadata, pb.ModelMetadataRequest),
                   "ModelInfer": (self.infer, pb.ModelInferRequest)}
        return grpc.method_handlers_generic_handler(SERVICE, {
            name: grpc.unary_unary_rpc_method_handler(self._guarded(fn), request_deserializer=cls.FromString,
                                                      response_serializer=lambda msg: msg.SerializeToString())
            for name, (fn, cls) in methods.items()})

    def _guarded(self, fn):
        """The token checked first; a Failure becomes the protocol's status code with its one-line message."""
        def call(request, context: grpc.ServicerContext):
            auth = dict(context.invocation_metadata()).get("authorization")
            try:
                if not self.front.authorized(auth):
                    raise Failure("unauthorized", "a bearer token is required (metadata authorization: Bearer TOKEN)")
                return fn(request)
            except Failure as failure:
                context.abort(getattr(grpc.StatusCode, failure.grpc_code), str(failure))
        return call

    def live(self, _request) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    def ready(self, _request) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.front.ready)

    def model_ready(self, request) -> pb.ModelReadyResponse:
        model = self.front.model(request.name)
        return pb.ModelReadyResponse(ready=self.front.accepting and model.session.ready)

    def server_metadata(self, _request) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**server_metadata(self.version))

    def model_metadata(self, request) -> pb.ModelMetadataResponse:
        model = self.front.model(request.name)
        m = model.manifest
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=model.name, versions=["1"], platform="edgec",
            inputs=[tensor(name=t.name, datatype=datatype(t.dtype), shape=list(t.shape)) for t in m.inputs],
            outputs=[tensor(name=t.name, datatype=datatype(t.dtype), shape=list(t.shape)) for t in m.outputs])

    def infer(self, request) -> pb.ModelInferResponse:
        model = self.front.model(request.model_name)
        try:
            parsed = _parse(request, model.manifest)
        except InputError as exc:
            failure = self.front.bad_request(exc)
            self.front.failed(model.name, failure.kind)
            raise failure from None
        outputs = self.front.infer(model, parsed)
        response = pb.ModelInferResponse(model_name=model.name, model_version="1", id=request.id)
        for name in parsed.outputs or list(outputs):
            array = outputs[name]
            response.outputs.add(name=name, datatype=datatype(array.dtype.name), shape=list(array.shape))
            response.raw_output_contents.append(np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes())
        return response


def _parse(request, m) -> InferRequest:
    """The request's inputs checked against the model, as the REST front's are (oip.decode_tensor)."""
    specs = {t.name: t for t in m.inputs}
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: give one per input, or none")
    inputs = {}
    for i, t in enumerate(request.inputs):
        if t.name not in specs:
            raise BadRequest(f"unknown input {t.name[:80]!r} (the model's: {', '.join(specs)})")
        if t.name in inputs:
            raise BadRequest(f"input {t.name!r} given twice")
        field = _CONTENTS.get(t.datatype)
        data = list(getattr(t.contents, field)) if field and not raw else None
        inputs[t.name] = decode_tensor(t.name, list(t.shape), t.datatype, data, raw[i] if raw else None, specs[t.name])
    missing = [n for n in specs if n not in inputs]
    if missing:
        raise BadRequest(f"missing input(s) {', '.join(map(repr, missing))}")
    names = [o.name for o in m.outputs]
    wanted = [o.name for o in request.outputs]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise BadRequest(f"unknown output {unknown[0][:80]!r} (the model's: {', '.join(names)})")
    return InferRequest(request.id or None, inputs, wanted or None, {}, False)

"""Serving: the long-lived session over a build's workers (`edgec.Cluster`) and the network front over it.

- session.py: `Cluster`, the session API: start or reach the workers once, then answer any number of
  requests (`infer`, `submit`) from any thread, with failover and adaptation as `edgec run` has them.
- oip.py: the Open Inference Protocol (KServe v2) in code: tensors in and out of JSON and binary data,
  model metadata, its errors; no transport.
- front.py: what both fronts share (models, token, errors); http_front.py, grpc_front.py (with
  grpc_service.proto and its generated grpc_service_pb2.py): the REST and gRPC fronts of `edgec serve`;
  metrics.py: the Prometheus figures; server.py: the `edgec serve` process (signals, status line).

May import the rest of edgec.runtime below the front (coordinator, manifest, inputs, errors, adapt, keys);
never api.py or cli.py, which are clients of this package.
"""

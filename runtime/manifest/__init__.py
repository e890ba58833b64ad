"""The manifest: the contract between compiler and runtime, read from the manifest alone.

- types.py: the dataclasses a manifest parses into; parse.py: JSON -> those types, with one-line errors;
  load.py: loading, validation and the JSON written back (the schema is documented there);
- schedule.py: the schedule's cross-checks (dataflow, send/recv pairs, deadlock) and what the host feeds;
  signatures.py: the manifest's tensors against its fragments' own ONNX signatures;
- replay.py: the planner's timeline of the schedule, replayed (the compiler's simulate uses it).

May import the runtime's base modules (errors, linkmodel, the package's format constants); nothing of the
other rooms (wire, device, coordinator, serve, front), which all read manifests through this one.
"""

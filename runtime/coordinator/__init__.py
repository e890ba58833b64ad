"""The coordinator side: what runs a build's requests through the devices' workers, on the host.

- pool.py: WorkerPool, the workers of one plan, whose jobs are parts of their own: workers.py (where each
  worker is, the connection's state), connect.py (starting and reaching workers, the handshake), shipping.py
  (fragment files), window.py (the request window), liveness.py (heartbeats, exits, deadlines: DeviceLost),
  clocks.py (clock sync); failover.py: FailoverPool, a pool that survives a lost device and switches plans;
- adapt.py: --adapt, switching between kept plans on measured figures; emulate.py: --emulate's shared channel,
  overruns and undilation; accuracy.py: --report, the plan's predictions against what a run measured;
  trace.py: --trace, the measured timeline; inputs.py: the model inputs a run feeds; verify.py: --verify,
  the outputs against onnxruntime on the whole model.

May import the runtime's base modules, the manifest, the wire and the device room (the fragment executor's
options, for --verify); never serve or front, which drive this room.
"""

"""The coordinator side: what runs a build's requests through the devices' workers, on the host.

- pool.py: the worker pool (reaching and starting workers, shipping fragments, the request window, liveness,
  clock sync, close); failover: a pool that survives a lost device;
- adapt.py: --adapt, switching between kept plans on measured figures; emulate.py: --emulate's shared channel,
  overruns and undilation; accuracy.py: --report, the plan's predictions against what a run measured;
  trace.py: --trace, the measured timeline; inputs.py: the model inputs a run feeds; verify.py: --verify,
  the outputs against onnxruntime on the whole model.

May import the runtime's base modules, the manifest, the wire and the device room (the fragment executor's
options, for --verify); never serve or front, which drive this room.
"""

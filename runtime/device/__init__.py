"""The device side: what runs on each device.

- worker.py: `edgec worker`, the daemon that serves one coordinator's run at a time; session.py: one run on a
  worker (the manifest, the coordinator's messages, its requests), and peers.py its data sockets to the other
  devices (the tensors from and to its peers); steps.py: one request through the device's steps; sequences.py: a
  generative session's per-sequence state (KV caches), kept on the device; choose.py: the next token from the
  logits (greedy or seeded sampling), chosen where the logits are;
- executor.py: onnxruntime sessions for the device's fragments; cache.py: the fragment cache, files keyed by
  their sha256; emulate.py: --emulate's padded runs and delayed links;
- zygote.py: local workers forked from a process that has imported the worker's modules once (the
  coordinator starts it; the worker needs none of it).

May import the runtime's base modules, the manifest and the wire; never the coordinator, serve or front
(a device that only runs workers needs none of them).
"""

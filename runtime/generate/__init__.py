"""Generation: a generative build's sequences (manifest version 2) through the devices' workers, step by step,
each fragment's caches kept on its device (device/sequences.py).

- feeds.py: each step's model inputs as the manifest's `generate` block says (token, positions, mask), and the
  shapes that change from step to step;
- pool.py: GeneratePool, the worker pool whose requests are steps of sequences (begin, run with seq, drop), each
  giving the token id the last stage chose (device/choose.py), which that stage also sends straight to the
  first as the sequence's next step's input (the token's direct path: run's next_req and token_from);
- loop.py: the decode loop, S sequences in flight at once (pipelined), up to two steps of each: prefill, then
  one step per token, each issued before its token is known;
- reference.py: --verify, the whole model's decode loop in onnxruntime, token by token;
- api.py: generate(), what `edgec generate` and `edgec.generate` run.

May import the runtime's base modules, the manifest, the wire, the device room (the executor's session options,
the token's routes, the worker's limits)
and the coordinator (the worker pool it extends, --verify's comparison); never serve or front.
"""

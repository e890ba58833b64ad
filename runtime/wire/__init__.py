"""The wire: validated, authenticated messages between the coordinator and the workers.

- net.py: worker addresses (tcp://HOST:PORT) and the loopback test; keys.py: the cluster's ZeroMQ CURVE keys
  (pyzmq's zmq.auth, no cryptography of ours);
- compress.py: the tensor codecs with bounded decoding; chooser.py: which codec a transfer uses (`auto`, on
  this machine's measured codec costs); transport.py: the framing (a msgpack header, a raw payload) and tensor
  messages; protocol.py: the message types and the checks every received message passes; inbox.py: a worker's
  received tensors, bounded, until a recv step takes them.

May import the runtime's base modules (errors, linkmodel) and the manifest room (dtypes); nothing of device,
coordinator, serve or front, which all speak through this room.
"""

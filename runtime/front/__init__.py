"""The front: the runtime's entry points, thin over the rooms below.

- cli.py: `edgec run`, `edgec run-all`, `edgec serve`, `edgec worker` and `edgec keygen` (and the device-only
  distribution's `edgec`); api.py: `edgec.run(...)`, what `edgec run --json` prints; runall.py: `edgec run-all`,
  the builds of an `edgec allocate` run at once.

May import every other room (coordinator, serve, device, wire, manifest) and the base; nothing imports the
front but the package's __main__ (`python -m edgec.runtime`) and the compiler's CLI, which adds these commands.
"""

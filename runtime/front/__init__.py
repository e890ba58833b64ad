"""The front: the runtime's entry points, thin over the rooms below.

- cli.py: `edgec run`, `edgec worker`, `edgec keygen` and `edgec profile` (and the device-only distribution's
  `edgec`), with `edgec run-all` in run_all_cli.py, `edgec serve` in serve_cli.py and what the commands share
  (option types, progress, exit codes) in kit.py; api.py: `edgec.run(...)`, what `edgec run --json` prints; runall.py: `edgec run-all`,
  the builds of an `edgec allocate` run at once.

May import every other room (coordinator, serve, device, wire, manifest) and the base; nothing imports the
front but the package's __main__ (`python -m edgec.runtime`) and the compiler's CLI, which adds these commands.
"""

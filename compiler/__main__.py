"""`python -m edgec.compiler` is the `edgec` command."""

from .cli import main

main()

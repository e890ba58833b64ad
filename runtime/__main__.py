"""`python -m edgec.runtime MANIFEST ...`: the same command as `edgec run`."""

from .front.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    main()

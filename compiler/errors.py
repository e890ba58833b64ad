"""User-facing errors: one line naming the file and the problem, exit code 2."""

__all__ = ["UserError"]


class UserError(Exception):
    """Bad input from the user (file, option, cluster). The CLI prints `edgec: <message>` and exits 2."""

    def __init__(self, message: str, path: str | None = None):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)

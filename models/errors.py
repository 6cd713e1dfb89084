"""The one error family a user sees as a single line (exit code 1), never as a traceback."""


class UserError(Exception):
    """Bad input from the user or a bad file: the message says what and where."""

"""The one user-facing error type: what went wrong and what to do about it, in one line."""

from __future__ import annotations


class TfcliError(Exception):
    """A mistake the user can fix. The CLI prints it as one red line and exits with code 2.

    `message` says what is wrong; `hint` says what to do. Internal bugs are never TfcliError.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class Interrupted(Exception):
    """A run stopped by a signal after saving what it could. The CLI prints the message (not as an error)
    and exits with `exit_code`: 130 for SIGINT (Ctrl-C), 143 for SIGTERM."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def a_or_an(word: str) -> str:
    """The word with its article, for messages. Example: a_or_an("encoder") -> "an encoder" """
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"

"""The one error type for "a user's input is wrong": a model that cannot be loaded, a file that is missing, a value
out of range. Every front end (the command line, the demo page, the Space) shows it as one line; the library raises
it with the words a user can act on. It imports nothing, so a front end can catch it before torch is loaded."""


class InputError(Exception):
    """An error the user can act on, said in one line: the command line prints it (exit code 1), the page shows it."""

"""The one exception type the CLI turns into a one-line message and exit code 2."""


class GhsimError(Exception):
    """Bad input from the user: unknown name, malformed file, impossible plan.

    The message is shown as is, on one line, so it should name the file or
    flag at fault and say what is wrong with it.
    """

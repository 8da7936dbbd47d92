"""The one exception type for user mistakes: the CLI prints its message and exits with code 2."""


class MtppError(Exception):
    """A problem with the user's input (file, option, model) that the user can fix.

    The message names the thing to fix; the CLI prints it on one line without a traceback.
    """

"""The one exception type for user mistakes: the CLI prints its message and exits with code 2."""


class MtppError(Exception):
    """A problem with the user's input (file, option, model) that the user can fix.

    The message names the thing to fix; the CLI prints it on one line without a traceback.
    """


def first_line(e: BaseException, default: str | None = None) -> str:
    """The first non-blank line of an exception's message, for a one-line error (onnx and
    onnxruntime messages span many lines); ``default``, else the exception's type name, when
    the message is empty.

    >>> first_line(ValueError("\\n  bad shape\\n  at node 3")), first_line(KeyError())
    ('bad shape', 'KeyError')
    """
    text = str(e).strip()
    if not text:
        return type(e).__name__ if default is None else default
    return text.splitlines()[0].strip()

"""gpufeed's exceptions (raised from the C++ core by gpufeed._C's exception translator)."""


class DecodeError(RuntimeError, OSError):
    """A sample could not be read or decoded.

    Raised by iterating a ``gpufeed.DataLoader`` with ``on_error="raise"`` (the error of the
    batch's first failing sample in sampler order) and by ``gpufeed.decode_image``. A subclass of
    both RuntimeError (what PyTorch's DataLoader re-raises from a worker) and OSError (what PIL's
    ``Image.open`` raises for an unreadable image), so either ``except`` clause catches it.

    Attributes:
        path: the file (or ``"<bytes>"``).
        kind: ``"empty"``, ``"truncated"``, ``"corrupt"``, ``"unsupported"``, ``"too_large"``
            or ``"io"`` (missing, unreadable, changed under the loader).
        reason: the reason, without the path and kind.
    str(error) reads ``"<path>: <kind>: <reason>"``.
    """

    def __init__(self, message, path="", kind="", reason=""):
        RuntimeError.__init__(self, message)
        self.path = path
        self.kind = kind
        self.reason = reason

    def __str__(self):
        return self.args[0] if self.args else ""

    def __reduce__(self):
        return (type(self), (str(self), self.path, self.kind, self.reason))


class SkipLimitExceeded(RuntimeError):
    """With ``on_error="skip"``, more than ``max_skips`` samples of one epoch failed.

    Attributes:
        summary: the epoch's skip account up to the batch that crossed the limit
            (the dict ``DataLoader.epoch_summary()`` returns).
        max_skips: the limit in force.
    """

    def __init__(self, message, summary=None, max_skips=0):
        super().__init__(message)
        self.summary = summary or {}
        self.max_skips = max_skips

    def __reduce__(self):
        return (type(self), (self.args[0], self.summary, self.max_skips))

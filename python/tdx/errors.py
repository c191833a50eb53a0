"""Errors tdx raises. Every message says what to do instead."""

from . import _C


class TdxError(Exception):
    """Base class of the errors tdx raises."""


class CaptureError(TdxError, _C.CaptureError):
    """Something could not be recorded or replayed (also raised by the engine)."""


class FakeTensorError(TdxError, RuntimeError):
    """The data of a fake tensor was asked for; a fake tensor has none."""

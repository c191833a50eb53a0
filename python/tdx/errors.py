"""Errors tdx raises. Every message says what to do instead."""

from . import _C


class TdxError(Exception):
    """Base class of the errors tdx raises."""


class CaptureError(TdxError, RuntimeError):
    """Something could not be recorded, replayed or compiled (also raised by
    the native engine)."""


class FakeTensorError(TdxError, RuntimeError):
    """The data of a fake tensor was asked for; a fake tensor has none."""


_C._set_capture_error_type(CaptureError)

"""Errors tdx raises. Every message says what to do instead."""

from . import _C


class TdxError(Exception):
    """Base class of the errors tdx raises."""


class CaptureError(TdxError, RuntimeError):
    """Something could not be recorded, replayed or compiled (also raised by
    the native engine)."""


class FakeTensorError(TdxError, RuntimeError):
    """The data of a fake tensor was asked for; a fake tensor has none."""


class CheckpointError(TdxError, RuntimeError):
    """A checkpoint or tensor file is missing a part, corrupt, or does not
    fit what reads it; the message names the file, tensor and offset."""


class InputError(TdxError, ValueError):
    """Inputs that are not what the compiled program takes: their number,
    or an input's shape or dtype; the message names the input, what the
    program expects and what was given."""


class TdxWarning(UserWarning):
    """A run that succeeded but did something the user may not expect (a
    parameter the --params file lacks started from its init program)."""


_C._set_capture_error_type(CaptureError)
_C._set_checkpoint_error_type(CheckpointError)

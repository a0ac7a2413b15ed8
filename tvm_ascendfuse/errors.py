"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""


class AscendFuseError(Exception):
    """Base class: the message names the problem and, where possible, the fix."""


class TargetError(AscendFuseError):
    """A target description is missing a field, has a nonsensical value or an unknown key."""


class SwitchError(AscendFuseError):
    """A fusion switch file is malformed or names an unknown pass."""


class ModelError(AscendFuseError):
    """An input model cannot be read or imported."""


class UnsupportedOpError(AscendFuseError):
    """The model uses an operator that the importer or a pass cannot handle."""


class UBCapacityError(AscendFuseError):
    """A scheduled kernel needs more on-chip buffer than the target has."""

    def __init__(self, kernel: str, scope: str, needed: int, available: int):
        self.kernel, self.scope, self.needed, self.available = kernel, scope, needed, available
        super().__init__(
            f"kernel '{kernel}' needs {needed} bytes of {scope} but the target has {available} bytes usable"
        )

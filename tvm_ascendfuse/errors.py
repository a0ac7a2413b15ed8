"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""


class AscendFuseError(Exception):
    """Base class: the message names the problem and, where possible, the fix."""


class TargetError(AscendFuseError):
    """A target description is missing a field, has a nonsensical value or an unknown key."""


class SwitchError(AscendFuseError):
    """A fusion switch file is malformed or names an unknown pass."""


class OptionError(AscendFuseError):
    """An option passed to an entry point (``torch.compile``'s ``options``) is unknown or has a bad value."""


class ModelError(AscendFuseError):
    """An input model cannot be read or imported."""


class UnsafeModelError(ModelError):
    """A model refused before its data is read: external data outside the model's folder, or tensors that
    declare more bytes than the model provides."""


class UnsupportedOpError(AscendFuseError):
    """The model uses an operator that the importer or a pass cannot handle."""


class PrecisionModeError(AscendFuseError):
    """An unknown precision mode, or one the target cannot run (bf16 on a target without bf16)."""


class PatternCheckError(AscendFuseError):
    """A pattern's check or working-set function raised instead of answering (a bug in that pattern)."""


class UBCapacityError(AscendFuseError):
    """A scheduled kernel needs more on-chip buffer than the target has."""

    def __init__(self, kernel: str, scope: str | None = None, needed: int | None = None,
                 available: int | None = None):
        if scope is None:
            # Rebuilt from its message after crossing TVM's FFI (a pass raised it inside tvm.compile).
            import re

            m = re.search(r"kernel '(.*)' needs (\d+) bytes of (\S+) but the target has (\d+) bytes", kernel)
            if m:
                kernel, needed, scope, available = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
        self.kernel, self.scope, self.needed, self.available = kernel, scope, needed, available
        super().__init__(
            f"kernel '{kernel}' needs {needed} bytes of {scope} but the target has {available} bytes usable"
        )


def _keep_type_across_tvm_ffi() -> None:
    """Errors raised in our passes run inside tvm.compile; registering the class keeps its type."""
    try:
        import tvm_ffi

        tvm_ffi.register_error("UBCapacityError", UBCapacityError)
        tvm_ffi.register_error("PatternCheckError", PatternCheckError)
        tvm_ffi.register_error("UnsupportedOpError", UnsupportedOpError)
        tvm_ffi.register_error("PrecisionModeError", PrecisionModeError)
    except (ImportError, AttributeError):
        pass


_keep_type_across_tvm_ffi()

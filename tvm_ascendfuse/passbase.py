"""Python passes that are real ``tvm.transform.Pass`` objects without reference cycles.

Calling a ``PyPass`` subclass returns a ``ModulePass`` whose attributes forward to the Python instance.
The pass function captures only that instance, never the FFI object, so both are freed normally (TVM's
own ``module_pass`` decorator does the same; we need per-instance pass names, which it cannot give).
"""

from __future__ import annotations

import tvm
from tvm.ir.transform import ModulePass, PassInfo


class _PassHandle(ModulePass):
    def __init__(self, impl, name: str):
        self.__init_handle_by_constructor__(
            tvm.ir.transform._ffi_transform_api.MakeModulePass,
            lambda mod, _ctx: impl.transform_module(mod), PassInfo(0, name, []))
        self._impl = impl

    def __getattr__(self, name):
        return getattr(self._impl, name)


class PyPass:
    """Subclass, define ``__init__`` and ``transform_module(mod) -> mod``; ``pass_name()`` names it."""

    def __new__(cls, *args, **kwargs):
        impl = super().__new__(cls)
        impl.__init__(*args, **kwargs)
        return _PassHandle(impl, impl.pass_name())

    def pass_name(self) -> str:
        return type(self).__name__

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        raise NotImplementedError

"""A torch function mode that catches tensors created without a device during a step.

On a CPU host every tensor lands on the CPU whether or not its factory named a device, so a
`torch.empty(shape, dtype=...)` inside the forward pass passes every CPU test and breaks the
CUDA path (its output lands on the host and the next matmul mixes devices). The mode records
every factory call (torch's own list of device-taking constructors) that names no device, with
the caller's file and line, and every tensor a call returns on a device other than the step's.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

import tailgate

FACTORIES = _device_constructors()
PACKAGE = str(Path(tailgate.__file__).parent) + "/"


class DeviceGuard(TorchFunctionMode):
    def __init__(self, device: torch.device | str):
        super().__init__()
        self.device = torch.device(device)
        self.deviceless: list[str] = []  # "func at file:line" of factory calls without a device
        self.elsewhere: list[str] = []  # results on another device than the step's

    def _caller(self) -> str:
        for f in reversed(traceback.extract_stack()[:-2]):
            if f.filename.startswith(PACKAGE):
                return f"{f.filename.removeprefix(PACKAGE)}:{f.lineno}"
        return "?"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            self.deviceless.append(f"torch.{func.__name__} at tailgate/{self._caller()}")
        out = func(*args, **kwargs)
        if (
            isinstance(out, torch.Tensor)
            and out.device.type not in (self.device.type, "meta")
            and func not in FACTORIES
        ):  # host tensors made on purpose name their device
            self.elsewhere.append(f"{getattr(func, '__name__', func)} -> {out.device} at tailgate/{self._caller()}")
        return out

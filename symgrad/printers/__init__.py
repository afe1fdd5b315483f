"""SymPy -> framework source printers, one module per framework."""

from symgrad.printers.base import FrameworkPrinter, UnsupportedError
from symgrad.printers.tensorflow import TensorFlowPrinter
from symgrad.printers.torch import TorchPrinter

PRINTERS: dict[str, type[FrameworkPrinter]] = {
    "torch": TorchPrinter,
    "tensorflow": TensorFlowPrinter,
}

__all__ = ["PRINTERS", "FrameworkPrinter", "TensorFlowPrinter", "TorchPrinter", "UnsupportedError"]

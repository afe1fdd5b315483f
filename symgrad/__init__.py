"""symgrad: derive stable custom gradients for PyTorch and TensorFlow from a YAML spec."""

__version__ = "0.1.0"

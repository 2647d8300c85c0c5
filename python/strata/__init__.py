"""strata: run Mixture-of-Experts LLMs from GGUF with experts streamed into a device cache."""

from strata._core import ConfigError, Error, FormatError, MemoryError, UnsupportedError
from strata.model import Completion, Model, inspect

__version__ = "0.1.0"
__all__ = [
           "Completion",
           "ConfigError",
           "Error",
           "FormatError",
           "MemoryError",
           "Model",
           "UnsupportedError",
           "__version__",
           "inspect",
]

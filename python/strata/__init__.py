"""strata: run Mixture-of-Experts LLMs from GGUF with experts streamed into a device cache."""

import os as _os

from strata import _core
from strata._core import ConfigError, Error, FormatError, MemoryError, UnsupportedError
from strata.model import Completion, Model, inspect

__version__ = "0.1.0"
_core.set_log_level(_os.environ.get("STRATA_LOG", "warn"))
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

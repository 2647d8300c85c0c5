"""strata: run Mixture-of-Experts LLMs from GGUF with experts streamed into a device cache."""

from strata import _core
from strata._core import ConfigError, Error, FormatError, MemoryError, UnsupportedError
from strata._options import LOAD_DEFAULTS, StrataWarning
from strata._options import log_level_from_env as _log_level_from_env
from strata.info import ModelInfo, inspect
from strata.model import GENERATE_DEFAULTS, Backend, Completion, Model

__version__ = "0.1.0"
_core.set_log_level(_log_level_from_env())
__all__ = [
    "GENERATE_DEFAULTS",
    "LOAD_DEFAULTS",
    "Backend",
    "Completion",
    "ConfigError",
    "Error",
    "FormatError",
    "MemoryError",
    "Model",
    "ModelInfo",
    "StrataWarning",
    "UnsupportedError",
    "__version__",
    "inspect",
]

"""strata: run Mixture-of-Experts LLMs from GGUF with experts streamed into a GPU cache."""

from strata._core import ConfigError, Error, FormatError, MemoryError, UnsupportedError

__version__ = "0.1.0"
__all__ = ["Error", "FormatError", "UnsupportedError", "MemoryError", "ConfigError", "__version__"]

"""A small INI-style configuration parser."""

from iniconf.parser import Config, MissingOptionError, ParseError, parse

__all__ = ["Config", "MissingOptionError", "ParseError", "parse"]
__version__ = "0.4.1"

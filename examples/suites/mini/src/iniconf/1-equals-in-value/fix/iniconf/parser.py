"""Parsing INI-style text into a :class:`Config`."""

_MISSING = object()
_TRUE = {"1", "yes", "true", "on"}
_FALSE = {"0", "no", "false", "off"}


class ParseError(ValueError):
    """The text is not valid configuration."""

    def __init__(self, line_number, message):
        super().__init__(f"line {line_number}: {message}")
        self.line_number = line_number


class MissingOptionError(KeyError):
    """The configuration has no such section or option."""

    def __init__(self, section, key):
        super().__init__(f"no option {key!r} in section [{section}]")
        self.section = section
        self.key = key


class Config:
    """Parsed configuration: sections of string options, with typed getters."""

    def __init__(self, sections=None):
        self._sections = {name: dict(options) for name, options in (sections or {}).items()}

    def sections(self):
        return list(self._sections)

    def options(self, section):
        return dict(self._sections.get(section, {}))

    def get(self, section, key, fallback=_MISSING):
        """The option's text; ``fallback`` when it is missing (else :class:`MissingOptionError`)."""
        try:
            return self._sections[section][key]
        except KeyError:
            if fallback is not _MISSING:
                return fallback
            raise MissingOptionError(section, key) from None

    def get_int(self, section, key, fallback=None):
        """The option as an integer."""
        try:
            value = self.get(section, key)
        except MissingOptionError:
            if fallback:
                return fallback
            raise
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"[{section}] {key} = {value!r} is not an integer") from None

    def get_bool(self, section, key, fallback=None):
        """The option as a boolean: 1/yes/true/on or 0/no/false/off, in any case."""
        try:
            value = self.get(section, key)
        except MissingOptionError:
            if fallback:
                return fallback
            raise
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(f"[{section}] {key} = {value!r} is not a boolean")


def parse(text):
    """Parse configuration text. Options before the first section header are an error."""
    sections = {}
    current = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(number, f"unterminated section header {line!r}")
            current = line[1:-1].strip()
            if not current:
                raise ParseError(number, "empty section name")
            sections.setdefault(current, {})
            continue
        if "=" not in line:
            raise ParseError(number, f"expected 'key = value', got {line!r}")
        if current is None:
            raise ParseError(number, "option outside of any section")
        # Only the first "=" separates the key: values may contain more (URLs, base64).
        key, _, value = line.partition("=")
        key = key.strip()
        if not key:
            raise ParseError(number, "empty option name")
        sections[current][key] = value.strip()
    return Config(sections)

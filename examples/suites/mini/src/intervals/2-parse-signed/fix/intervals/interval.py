"""The closed interval type."""

import re

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_PATTERN = re.compile(r"^\s*\[\s*(" + _NUMBER + r")\s*,\s*(" + _NUMBER + r")\s*\]\s*$")


def _number(text):
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


class Interval:
    """A closed interval ``[start, end]`` of numbers, with ``start <= end``."""

    __slots__ = ("end", "start")

    def __init__(self, start, end):
        if start > end:
            raise ValueError(f"interval start {start!r} is after its end {end!r}")
        self.start = start
        self.end = end

    @classmethod
    def parse(cls, text):
        """Read an interval written as ``[start, end]``, e.g. ``"[1, 2.5]"``."""
        match = _PATTERN.match(text)
        if match is None:
            raise ValueError(f"not an interval: {text!r}")
        return cls(_number(match.group(1)), _number(match.group(2)))

    @property
    def length(self):
        return self.end - self.start

    def contains(self, value):
        """Whether ``value`` (a number or an interval) lies inside this interval."""
        if isinstance(value, Interval):
            return self.start <= value.start and value.end <= self.end
        return self.start <= value <= self.end

    def overlaps(self, other):
        """Whether the two intervals share at least one point."""
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other):
        """The shared part of both intervals, or ``None`` when they do not overlap."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def __eq__(self, other):
        if not isinstance(other, Interval):
            return NotImplemented
        return (self.start, self.end) == (other.start, other.end)

    def __hash__(self):
        return hash((self.start, self.end))

    def __repr__(self):
        return f"Interval({self.start!r}, {self.end!r})"

    def __str__(self):
        return f"[{self.start}, {self.end}]"

"""Closed numeric intervals and operations on lists of them."""

from intervals.interval import Interval
from intervals.ops import gaps, merge, total_length

__all__ = ["Interval", "gaps", "merge", "total_length"]
__version__ = "0.3.0"

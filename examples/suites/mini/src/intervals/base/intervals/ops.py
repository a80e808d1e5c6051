"""Operations on lists of intervals."""

from intervals.interval import Interval


def merge(intervals):
    """Merge overlapping intervals; the result is sorted and its intervals are disjoint."""
    ordered = sorted(intervals, key=lambda interval: (interval.start, interval.end))
    merged = []
    for current in ordered:
        if merged and current.start <= merged[-1].end:
            merged[-1] = Interval(merged[-1].start, current.end)
        else:
            merged.append(current)
    return merged


def total_length(intervals):
    """The length covered by the intervals, overlapping parts counted once."""
    return sum(interval.length for interval in merge(intervals))


def gaps(intervals, within):
    """The parts of ``within`` that none of the intervals cover, in order."""
    found = []
    cursor = within.start
    for interval in merge(intervals):
        if interval.end < within.start or interval.start > within.end:
            continue
        if interval.start > cursor:
            found.append(Interval(cursor, interval.start))
        cursor = max(cursor, interval.end)
    if cursor < within.end:
        found.append(Interval(cursor, within.end))
    return found

from intervals import Interval, gaps, merge, total_length


def test_merge_overlapping():
    assert merge([Interval(1, 3), Interval(2, 6), Interval(8, 9)]) == [
        Interval(1, 6),
        Interval(8, 9),
    ]


def test_merge_sorts_its_input():
    assert merge([Interval(8, 9), Interval(1, 2)]) == [Interval(1, 2), Interval(8, 9)]


def test_merge_touching():
    assert merge([Interval(1, 3), Interval(3, 4)]) == [Interval(1, 4)]


def test_merge_empty():
    assert merge([]) == []


def test_total_length():
    assert total_length([Interval(0, 2), Interval(1, 4), Interval(10, 11)]) == 5


def test_gaps():
    assert gaps([Interval(1, 2), Interval(4, 5)], within=Interval(0, 6)) == [
        Interval(0, 1),
        Interval(2, 4),
        Interval(5, 6),
    ]


def test_gaps_none_left():
    assert gaps([Interval(-1, 7)], within=Interval(0, 6)) == []

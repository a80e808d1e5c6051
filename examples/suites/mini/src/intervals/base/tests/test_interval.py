import pytest

from intervals import Interval


def test_rejects_reversed_bounds():
    with pytest.raises(ValueError):
        Interval(3, 1)


def test_length():
    assert Interval(2, 7).length == 5
    assert Interval(1.5, 1.5).length == 0


def test_contains_number_and_interval():
    span = Interval(0, 10)
    assert span.contains(0) and span.contains(10) and span.contains(4.2)
    assert not span.contains(10.5)
    assert span.contains(Interval(2, 3))
    assert not span.contains(Interval(8, 12))


def test_overlaps_shares_an_endpoint():
    assert Interval(1, 3).overlaps(Interval(3, 5))
    assert not Interval(1, 3).overlaps(Interval(4, 5))


def test_intersection():
    assert Interval(1, 5).intersection(Interval(3, 9)) == Interval(3, 5)
    assert Interval(1, 2).intersection(Interval(3, 4)) is None


@pytest.mark.parametrize(
    "text, start, end",
    [("[1, 5]", 1, 5), ("[0.5,2]", 0.5, 2), ("  [ 3 , 3 ] ", 3, 3)],
    ids=["integers", "decimal", "spaces"],
)
def test_parse(text, start, end):
    assert Interval.parse(text) == Interval(start, end)


@pytest.mark.parametrize("text", ["1, 5", "[1; 5]", "[a, b]", "[5, 1]"])
def test_parse_rejects(text):
    with pytest.raises(ValueError):
        Interval.parse(text)


def test_str_round_trip():
    assert Interval.parse(str(Interval(2, 4.5))) == Interval(2, 4.5)

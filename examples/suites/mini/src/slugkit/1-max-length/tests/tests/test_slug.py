import pytest

from slugkit import slugify, unique_slug


def test_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_collapses_runs_of_punctuation():
    assert slugify("  a -- b   /  c  ") == "a-b-c"


def test_custom_separator():
    assert slugify("Release notes 2.0", separator="_") == "release_notes_2_0"


def test_keeps_case_when_asked():
    assert slugify("Hello World", lowercase=False) == "Hello-World"


def test_drops_apostrophes():
    assert slugify("Don't panic") == "dont-panic"


def test_max_length_on_a_word_boundary():
    assert slugify("hello world", max_length=5) == "hello"


def test_max_length_longer_than_the_slug():
    assert slugify("short", max_length=50) == "short"


def test_max_length_drops_trailing_separator():
    assert slugify("Hello World Again", max_length=6) == "hello"
    assert slugify("a b c", max_length=4) == "a-b"


def test_max_length_with_custom_separator():
    assert slugify("one two three", separator="_", max_length=8) == "one_two"


def test_max_length_must_be_positive():
    with pytest.raises(ValueError):
        slugify("anything", max_length=0)


def test_unique_slug():
    assert unique_slug("Hello world", existing=set()) == "hello-world"
    assert unique_slug("Hello world", existing={"hello-world"}) == "hello-world-2"
    assert unique_slug("Hello world", existing={"hello-world", "hello-world-2"}) == "hello-world-3"

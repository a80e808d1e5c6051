import unittest

from iniconf import MissingOptionError, ParseError, parse

SAMPLE = """
# service settings
[server]
host = example.org
port = 8080
debug = Yes

; storage
[storage]
path = /var/lib/app
"""


class ParseTests(unittest.TestCase):
    def test_sections_in_order(self):
        self.assertEqual(parse(SAMPLE).sections(), ["server", "storage"])

    def test_values_are_stripped(self):
        self.assertEqual(parse(SAMPLE).get("server", "host"), "example.org")

    def test_comments_and_blank_lines_are_skipped(self):
        self.assertEqual(parse(SAMPLE).options("storage"), {"path": "/var/lib/app"})

    def test_empty_value(self):
        self.assertEqual(parse("[a]\nkey =\n").get("a", "key"), "")

    def test_value_containing_equals(self):
        config = parse("[db]\nurl = postgres://db.local/app?sslmode=require\n")
        self.assertEqual(config.get("db", "url"), "postgres://db.local/app?sslmode=require")

    def test_value_with_base64_padding(self):
        self.assertEqual(parse("[auth]\ntoken = c2VjcmV0==\n").get("auth", "token"), "c2VjcmV0==")

    def test_option_outside_section(self):
        with self.assertRaises(ParseError) as caught:
            parse("key = value\n")
        self.assertEqual(caught.exception.line_number, 1)

    def test_line_without_equals(self):
        with self.assertRaises(ParseError) as caught:
            parse("[a]\njust words\n")
        self.assertEqual(caught.exception.line_number, 2)

    def test_unterminated_header(self):
        with self.assertRaises(ParseError):
            parse("[server\n")


class GetterTests(unittest.TestCase):
    def setUp(self):
        self.config = parse(SAMPLE)

    def test_get_missing_raises(self):
        with self.assertRaises(MissingOptionError):
            self.config.get("server", "user")

    def test_get_fallback(self):
        self.assertEqual(self.config.get("server", "user", fallback="root"), "root")

    def test_get_int(self):
        self.assertEqual(self.config.get_int("server", "port"), 8080)

    def test_get_int_rejects_text(self):
        with self.assertRaises(ValueError):
            self.config.get_int("server", "host")

    def test_get_int_fallback(self):
        self.assertEqual(self.config.get_int("server", "workers", fallback=4), 4)

    def test_get_bool(self):
        self.assertIs(self.config.get_bool("server", "debug"), True)

    def test_get_bool_missing_raises(self):
        with self.assertRaises(MissingOptionError):
            self.config.get_bool("server", "verbose")


if __name__ == "__main__":
    unittest.main()

"""Tests of the `__ID__` tools, run with CPython: `python3 -m unittest`."""

import unittest

import plugin  # noqa: F401 - registers the tools
import trellis_plugin


class CountWordsTest(unittest.TestCase):
    def test_counts_words_and_lines(self):
        self.assertEqual(plugin.counts("one two\nthree\n"), {"words": 3, "lines": 2})

    def test_a_missing_file_is_an_error_the_agent_sees(self):
        with self.assertRaises((trellis_plugin.NotFound, trellis_plugin.Denied)):
            trellis_plugin.call("count_words", {"path": "no/such/file.txt"})

    def test_unknown_arguments_are_refused(self):
        with self.assertRaises(trellis_plugin.InvalidArguments):
            trellis_plugin.call("count_words", {"path": "a", "extra": 1})


if __name__ == "__main__":
    unittest.main()

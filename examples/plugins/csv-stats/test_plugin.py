"""Tests of the csv-stats tools under CPython: `python3 -m unittest` in this folder (with
`trellis_plugin.py` beside it, as `trellis plugin new` writes it, or on PYTHONPATH)."""

import unittest

import plugin
import trellis_plugin

SALES = "region,amount,note\nemea,10,ok\nus,30,\nemea,20,late\n"


class StatsTest(unittest.TestCase):
    def test_numeric_and_text_columns(self):
        result = plugin.stats(SALES, None)
        self.assertEqual(result["rows"], 3)
        self.assertEqual(result["columns"]["amount"],
                         {"filled": 3, "min": 10.0, "max": 30.0, "mean": 20.0})
        self.assertEqual(result["columns"]["region"], {"filled": 3, "distinct": 2})
        self.assertEqual(result["columns"]["note"]["filled"], 2)

    def test_an_unknown_column_is_invalid_arguments(self):
        with self.assertRaises(trellis_plugin.InvalidArguments):
            plugin.stats(SALES, ["price"])

    def test_the_tools_are_registered_with_their_hints(self):
        tools = {t.name: t for t in trellis_plugin.tools()}
        self.assertEqual(sorted(tools), ["csv_stats", "write_stats"])
        self.assertTrue(tools["csv_stats"].read_only)
        self.assertFalse(tools["write_stats"].read_only)


if __name__ == "__main__":
    unittest.main()

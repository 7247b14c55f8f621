"""Stand-in for the `expecttest` package (not in Debian 12), which torch's internal test
utilities import for expected-output assertions that the tests run here do not use."""
import unittest

ACCEPT = False  # expecttest: rewrite expected outputs in place (never here)


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 (upstream's name)
        self.assertEqual(str(actual).strip(), str(expect).strip())

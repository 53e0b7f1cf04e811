"""The numbers results report: metrics at the answer, the same for many patched rows, recovered fractions, and the
statistics behind every verdict."""

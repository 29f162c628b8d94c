"""The vocabulary: the device record, health verdicts, errors, names and the
Allocate response. Imports nothing else of hetero_dp; every other layer builds on it."""

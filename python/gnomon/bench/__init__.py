"""The microbenchmark harness behind `gnomon bench`."""

"""The microbenchmark harness behind `gnomon bench`.

- ``cases``: a case is an op of `gnomon.ops`, its shape params and dtypes; it computes its key,
  definition hash, FLOPs and bytes, and builds its inputs;
- ``suites``: the attention, moe, mxfp4 and norm suites at model shapes (scaled on a CPU);
- ``timing``: timers (perf_counter_ns; CUDA/HIP events), hot/cold inputs, the adaptive sampler
  and the quantile statistics;
- ``machine``: the machine fingerprint, the git commit and the peaks;
- ``runner``: runs a sweep (``run_bench``) and writes the results file (``write_results``);
- ``results``: the results-file schema, shared with `gnomon dash`;
- ``report``: the rich table and progress bar.

Nothing here imports the dashboard's dependencies (SQLAlchemy, matplotlib).
"""

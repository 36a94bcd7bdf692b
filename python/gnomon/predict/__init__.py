"""Step-cost prediction: shapes, interchangeable predictors, the non-allocating simulated runner,
workloads, metrics and reports (DESIGN.md, layer 3)."""

"""The kernel regression dashboard: store, regression tests and static site."""

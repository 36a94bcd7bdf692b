"""Step-cost prediction: shapes, interchangeable predictors, the non-allocating simulated runner,
workloads, metrics and reports (DESIGN.md, layer 3).

The entry points are the modules `simulate`, `calibrate` and `validate` (each with the function
of its name). The public names resolve lazily, so that ``gnomon.predict.defaults`` (what the CLI reads to
build its parser) imports neither torch nor the engine.
"""

_EXPORTS = {
    "ModelSpec": "shapes", "StepShape": "shapes",
    "StepCost": "cost", "StepCostPredictor": "cost", "PredictionRefused": "cost",
    "RooflinePredictor": "roofline", "Efficiencies": "roofline",
    "CalibratedPredictor": "calibrated", "TablePredictor": "table",
    "SimulatedRunner": "simulated", "TimedRunner": "simulated", "VirtualClock": "simulated",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        module = importlib.import_module(f"gnomon.predict.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'gnomon.predict' has no attribute {name!r}")

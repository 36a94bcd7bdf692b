"""The CLI's defaults, importable without torch (``gnomon --help`` stays fast)."""

# gpt-oss-120b on one MI355X under a chat workload at 8 requests/s: the question in DESIGN.md.
DEFAULT_MODEL = "gpt-oss-120b"
DEFAULT_HARDWARE = "MI355X"
DEFAULT_WORKLOAD = "chat"
DEFAULT_RATE = 8.0
DEFAULT_NUM_REQUESTS = 200
DEFAULT_ENGINE = "gnomon"  # gnomon.predict.engines: whose scheduler defaults and host overhead
PREDICTOR_FORMS = "roofline, calibrated:FILE or table:FILE"

CALIBRATION_MODEL = "small-llama"
CALIBRATION_BENCH_SUITES = ("attention", "norm")
CALIBRATION_REQUESTS = 160

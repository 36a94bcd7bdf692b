"""The engine: model configs and weights, the scheduler, the KV-cache manager, the model runner,
the sampler, and the serving (`LLMEngine`) and offline (`LLM`) APIs."""


def __getattr__(name):  # lazy: importing gnomon.engine does not import torch
    if name in ("LLM", "LLMEngine", "RequestOutput", "CompletionOutput", "RequestMetrics"):
        from . import llm
        return getattr(llm, name)
    if name == "EngineConfig":
        from .engine_config import EngineConfig
        return EngineConfig
    if name == "SamplingParams":
        from .sampling_params import SamplingParams
        return SamplingParams
    if name == "SampleDelta":  # what LLMEngine.step() returns, one per sampled token
        from .sequence import SampleDelta
        return SampleDelta
    raise AttributeError(f"module 'gnomon.engine' has no attribute {name!r}")

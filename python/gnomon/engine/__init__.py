"""The engine: model configs and weights, the scheduler, the KV-cache manager, the model runner,
the sampler, and the serving (`LLMEngine`) and offline (`LLM`) APIs."""

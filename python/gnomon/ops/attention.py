"""PLACEHOLDER: the attention family's wrappers land here."""
def reshape_and_cache(*a, **k): raise NotImplementedError
def paged_attention(*a, **k): raise NotImplementedError

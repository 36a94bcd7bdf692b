"""Everything observable about an allocator without changing it, for before/after comparisons."""


def snapshot(a, seq_ids=range(64)):
    """Queue, ref counts, tables, cache and stats; pending copies aside (reading them clears them)."""
    present = [s for s in seq_ids if s in a]
    return {
        "queue": a.free_queue().tolist(),
        "refs": [a.ref_count(b) for b in range(a.num_blocks)],
        "tables": {s: a.block_table(s).tolist() for s in present},
        "computed": {s: a.num_computed_tokens(s) for s in present},
        "num_sequences": len(a),
        "cached": a.cached_blocks().tolist(),
        "num_free": a.num_free_blocks,
        "num_cached": a.num_cached_blocks,
        "usage": a.usage,
        "stats": a.stats(),
    }

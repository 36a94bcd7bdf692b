"""The pip extra each part of gnomon needs beyond the core, said in one line when it is missing.

The core (the allocator, `gnomon simulate` and its predictors) needs no torch; the ops, the
engine's real runs and `gnomon bench` need the ``engine`` extra, `gnomon dash` the ``dash`` one.
"""

ENGINE_EXTRA = "pip install 'gnomon[engine]'"


def require_torch(what: str) -> None:
    """Raise ModuleNotFoundError naming `what` and the extra when torch is not installed."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"{what} needs torch, from the engine extra: {ENGINE_EXTRA}",
                                  name="torch") from error

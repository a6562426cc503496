"""The token pacer, importable as ``sloserve.pacer`` (see :mod:`sloserve.serve.pacer`)."""

from sloserve.serve.pacer import TokenPacer, openai_chunk_tokens, pace

__all__ = ["TokenPacer", "openai_chunk_tokens", "pace"]

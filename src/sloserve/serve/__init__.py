"""Serving: the OpenAI-compatible gateway (later), and the client-side token pacer.

Importing this package loads no web framework: FastAPI and friends load lazily in the
modules that need them.
"""

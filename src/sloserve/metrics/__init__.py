"""Metrics: pure functions of per-request timelines."""

from sloserve.metrics.qoe import andes_qoe, consumption_times
from sloserve.metrics.summary import request_table, summarize, token_times

__all__ = ["andes_qoe", "consumption_times", "request_table", "summarize", "token_times"]

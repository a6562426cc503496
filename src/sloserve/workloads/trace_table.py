"""A loaded trace's rows and notes: :class:`TraceTable` (what every loader returns)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pandas is imported when a DataFrame is first needed (start-up time)
    import pandas as pd


@dataclass(init=False)
class TraceTable:
    """A loaded trace: the data and what was done to it.

    The rows are a DataFrame (``df=``), or (a loader that reads without pandas:
    ``sloserve``'s CSV) ``columns``, name -> array or list, with ``df`` built from them on
    first use. Until then the accessors below read ``columns`` without building ``df``;
    once ``df`` is built (or assigned) ``columns`` is dropped, so every reader goes
    through ``df`` and an in-place edit of it is seen."""

    source: str
    notes: list[str] = field(default_factory=list)
    columns: dict[str, Any] | None = field(default=None, repr=False)

    def __init__(
        self,
        df: pd.DataFrame | None = None,
        source: str = "",
        notes: list[str] | None = None,
        columns: dict[str, Any] | None = None,
    ) -> None:
        if df is None and columns is None:
            raise TypeError("TraceTable needs df or columns")
        self._df = df
        self.source = source
        self.notes = [] if notes is None else notes
        self.columns = None if df is not None else columns

    @property
    def df(self) -> pd.DataFrame:
        """The rows as a DataFrame (built from ``columns`` on first use, which then drops
        them)."""
        if self._df is None:
            import pandas as pd

            self._df, self.columns = pd.DataFrame(self.columns), None
        return self._df

    @df.setter
    def df(self, value: pd.DataFrame) -> None:
        self._df, self.columns = value, None

    @property
    def names(self) -> list[str]:
        """The column names, in order (without building ``df``)."""
        return list(self.columns) if self.columns is not None else list(self.df.columns)

    def num_rows(self) -> int:
        """How many rows (requests) the trace has (without building ``df``)."""
        return len(self.numbers(self.names[0])) if self.names else 0

    def numbers(self, col: str) -> np.ndarray:
        """A numeric column as a numpy array (its own dtype)."""
        if self.columns is not None:
            return np.asarray(self.columns[col])
        return self.df[col].to_numpy()

    def texts(self, col: str) -> list[Any]:
        """A column as pandas' ``astype(str)`` gives it (a str per cell; pandas keeps
        missing cells missing)."""
        if self.columns is not None:
            return [str(v) for v in self.columns[col]]
        return self.df[col].astype(str).tolist()

    def objects(self, col: str) -> list[Any]:
        """A column's cells as they are (``hash_ids`` tuples)."""
        if self.columns is not None:
            return list(self.columns[col])
        return self.df[col].tolist()

    @property
    def has_arrivals(self) -> bool:
        return "arrival_s" in self.names

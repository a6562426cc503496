"""A loaded trace's rows and notes: :class:`TraceTable` (what every loader returns)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pandas is imported when a DataFrame is first needed (start-up time)
    import pandas as pd


@dataclass
class TraceTable:
    """A loaded trace: the data and what was done to it.

    The rows are a DataFrame, or (a loader that reads without pandas: ``sloserve``'s CSV)
    ``columns``, name -> array or list, with ``df`` built from them on first use; the
    accessors below read either without building the other."""

    _df: pd.DataFrame | None
    source: str
    notes: list[str] = field(default_factory=list)
    columns: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def df(self) -> pd.DataFrame:
        if self._df is None:
            import pandas as pd

            self._df = pd.DataFrame(self.columns)
        return self._df

    @df.setter
    def df(self, value: pd.DataFrame) -> None:
        self._df, self.columns = value, None

    @property
    def names(self) -> list[str]:
        return list(self.columns) if self.columns is not None else list(self.df.columns)

    def num_rows(self) -> int:
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

"""Bounded typer options and the walk from a flag to the config field it sets.

:func:`bounded` gives a command-only option (one that sets no config field) the bound of an
annotated type from :mod:`sloserve.core.bounds`: the check and the ``--help`` suffix both
come from that type. :func:`_field_at` finds the pydantic field behind a shared flag, whose
constraints ``_app.add_bound_help`` appends to the flag's help."""

from __future__ import annotations

from typing import Any

import typer

from sloserve.core.bounds import bound_text, check_value
from sloserve.core.errors import SloserveError


def bounded(kind: Any, *decls: str, help: str, **kw: Any) -> Any:
    """A typer option whose value must lie in the annotated type ``kind``
    (:mod:`sloserve.core.bounds`): the check and the ``--help`` suffix come from ``kind``."""

    def check(value: Any) -> Any:
        if value is None:
            return value
        try:
            return check_value(kind, value, decls[0])
        except SloserveError as e:
            raise typer.BadParameter(str(e).removeprefix(f"{decls[0]}: ")) from None

    return typer.Option(*decls, help=f"{help} {bound_text(kind)}", callback=check, **kw)


def _field_at(model: Any, path: tuple[str, ...]) -> Any:
    """The pydantic FieldInfo at ``path`` below ``model`` (through optionals and unions)."""
    info = None
    for key in path:
        info = None
        for m in _models(model):
            if key in m.model_fields:
                info = m.model_fields[key]
                break
        if info is None:
            return None
        model = info.annotation
    return info


def _models(tp: Any) -> list[Any]:
    """The pydantic models inside an annotation (``A | None``, ``Annotated[A | B, ...]``)."""
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in get_args(tp) for m in _models(a)]

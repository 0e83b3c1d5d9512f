"""What the commands share: a config from flags and a file, list flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from hfx.config import model_from_args
from hfx.evaluation import write_json

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["config_of", "csv_list", "write_json"]

_Schema = TypeVar("_Schema", bound="BaseModel")


def config_of(schema: type[_Schema], args: argparse.Namespace, config_file: str | Path | None,
            /, **overrides: Any) -> _Schema:
    """model_from_args, typed: it builds an instance of ``schema`` but its signature says
    BaseModel."""
    return cast(_Schema, model_from_args(schema, args, config_file, **overrides))


def csv_list(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            items = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list: {text!r}") from None
        if not items:
            raise argparse.ArgumentTypeError("expected at least one value")
        return items
    return parse

"""Flags from the configuration's fields (one ``--flag`` per field, its help text and default,
grouped by section) and a configuration from a YAML file and the flags given."""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

from hfx.config.sections import SECTIONS, Section


# ---- --------------------------------------------------------------------------
def parse_params(text: str) -> dict[str, float | str]:
    """``a=1,b=x`` → {"a": 1.0, "b": "x"}: numbers where they parse, strings otherwise."""
    out: dict[str, float | str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected key=value, got {item!r}")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            out[key.strip()] = value.strip()
    return out


def _scalar_type(annotation: Any) -> type:
    """int | None → int; str → str."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def section_of(schema: type[BaseModel], name: str) -> str | None:
    """The section that defines field ``name`` of ``schema`` (None: the command's own field)."""
    for cls in reversed(schema.__mro__):
        if (isinstance(cls, type) and issubclass(cls, Section) and "section" in vars(cls)
                and name in vars(cls).get("__annotations__", {})):
            return cls.section
    return None


def add_model_args(parser: argparse.ArgumentParser, model: type[BaseModel],
                   exclude: tuple[str, ...] = ()) -> None:
    """One ``--flag`` per field, with the field's description and default as help, grouped by
    the section that defines it."""
    groups: dict[str | None, argparse._ArgumentGroup] = {}
    fields = [(section_of(model, n), n, f) for n, f in model.model_fields.items()
              if n not in exclude]
    order = [None, *SECTIONS]
    for section, name, field in sorted(fields, key=lambda x: order.index(x[0])):
        if section not in groups:
            title = f"{model.__name__} options" if section is None else f"{section} options"
            doc = None if section is None else SECTIONS[section].__doc__
            groups[section] = parser.add_argument_group(title, doc)
        group = groups[section]
        kind = _scalar_type(field.annotation)
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} (default: {field.default})".replace("%", "%%")
        if typing.get_origin(kind) is Literal:
            group.add_argument(flag, choices=typing.get_args(kind), default=argparse.SUPPRESS,
                               dest=name, help=help_text)
        elif typing.get_origin(kind) is list:
            group.add_argument(flag, action="append", default=argparse.SUPPRESS, dest=name,
                               metavar="VALUE", help=f"{field.description} (repeatable)")
        elif typing.get_origin(kind) is dict:
            group.add_argument(flag, type=parse_params, default=argparse.SUPPRESS, dest=name,
                               metavar="K=V,...", help=help_text)
        elif kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
        else:
            group.add_argument(flag, type=kind, default=argparse.SUPPRESS, dest=name,
                               metavar=kind.__name__.upper(), help=help_text)


def flatten_sections(data: dict[str, Any], where: str) -> dict[str, Any]:
    """YAML settings given flat or under their section's name, as one flat mapping."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        key = key.replace("-", "_")
        if key in SECTIONS and isinstance(value, dict):
            for k, v in value.items():
                k = k.replace("-", "_")
                if k not in SECTIONS[key].model_fields:
                    raise SystemExit(f"{where}: {key}: unknown setting {k!r}; the {key} section "
                                     f"has {', '.join(SECTIONS[key].model_fields)}")
                flat[k] = v
        else:
            flat[key] = value
    return flat


def model_from_args(schema: type[BaseModel], args: argparse.Namespace,
                    config_file: str | Path | None = None, /, **overrides: Any) -> BaseModel:
    """Field values from the YAML file, then from the flags given, then ``overrides``.

    Raises SystemExit with the validation messages on bad values.
    """
    values: dict[str, Any] = {}
    if config_file:
        data = yaml.safe_load(Path(config_file).read_text()) or {}
        if not isinstance(data, dict):
            raise SystemExit(f"{config_file}: expected a mapping of option: value")
        values.update(flatten_sections(data, str(config_file)))
    values.update({k: v for k, v in vars(args).items() if k in schema.model_fields})
    values.update(overrides)
    try:
        return schema(**values)
    except ValidationError as e:
        lines = [(f"  --{'.'.join(map(str, err['loc'])).replace('_', '-')}: " if err["loc"]
                  else "  ") + err["msg"].removeprefix("Value error, ") for err in e.errors()]
        raise SystemExit("invalid configuration:\n" + "\n".join(lines)) from None

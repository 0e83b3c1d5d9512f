"""Tenants as an operator declares them: a weight for fair shares, optional rate limits, and the
API keys that name them.

A YAML or JSON file (``--tenants``)::

    tenants:
      acme:   {weight: 2, api_keys: [sk-acme-1], requests_per_second: 20}
      hobby:  {tokens_per_minute: 100000}

A request's tenant is the owner of its API key when keys are declared, else its ``x-tenant``
header (or the Gateway API Inference Extension's ``x-gateway-inference-fairness-id``), else
``default``. An undeclared tenant has weight 1 and no limits. A bad entry stops the server at
start, naming the entry.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_FIELDS = ("weight", "requests_per_second", "tokens_per_minute", "api_keys")


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    weight: float = 1.0
    requests_per_second: float | None = None  # sustained; a burst of one second's worth
    tokens_per_minute: float | None = None  # prompt + max_tokens, charged at arrival
    api_keys: tuple[str, ...] = ()


def load_tenants(path: str | Path) -> dict[str, TenantSpec]:
    """The tenants of a file; ValueError naming the file and the entry that is wrong."""
    text = Path(path).read_text()
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: not valid {'JSON' if str(path).endswith('.json') else 'YAML'}"
                         f": {e}") from None
    table = data.get("tenants") if isinstance(data, dict) else None
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{path}: expected a 'tenants' mapping of name -> settings")
    specs: dict[str, TenantSpec] = {}
    owner: dict[str, str] = {}
    for name, entry in table.items():
        spec = _spec(str(name), entry or {}, f"{path}: tenant {name!r}")
        for key in spec.api_keys:
            if key in owner:
                raise ValueError(f"{path}: tenant {name!r}: an API key of tenant "
                                 f"{owner[key]!r} too")
            owner[key] = spec.name
        specs[spec.name] = spec
    return specs


def _spec(name: str, entry: Any, where: str) -> TenantSpec:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping of {', '.join(_FIELDS)}")
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown setting {unknown[0]!r}; known: {', '.join(_FIELDS)}")

    def positive(key: str) -> float | None:
        value = entry.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
                0 < value < math.inf):
            raise ValueError(f"{where}: {key} must be a positive number, got {value!r}")
        return float(value)

    keys = entry.get("api_keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"{where}: api_keys must be a list of non-empty strings")
    return TenantSpec(name, positive("weight") or 1.0, positive("requests_per_second"),
                      positive("tokens_per_minute"), tuple(keys))

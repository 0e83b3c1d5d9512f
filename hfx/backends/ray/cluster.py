"""Joining a Ray cluster for ``--ray`` / ``--ray-address``."""

from __future__ import annotations

from hfx.config import ServeConfig


def join_ray(config: ServeConfig) -> None:
    """A local Ray instance unless an address is given."""
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray: pip install 'hfx[ray]'") from None
    ray.init(address=config.ray_address, ignore_reinit_error=True)

"""Instances as Ray actors: ``RayInstance`` proxies, ``EngineActor`` runs a ``LocalInstance``."""

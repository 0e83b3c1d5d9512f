"""Simulator speed: how fast a simulated run goes, where its time goes."""

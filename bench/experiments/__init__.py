"""Experiments: capacity tables, the fair comparison of policies, the papers' figures."""

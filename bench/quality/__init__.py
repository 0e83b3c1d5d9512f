"""Test quality: mutation testing."""

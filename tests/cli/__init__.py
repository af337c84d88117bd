"""Tests of :mod:`costaware.cli`."""

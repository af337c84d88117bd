"""Tests of :mod:`costaware.runtime`."""

"""Tests of :mod:`costaware.measure`."""

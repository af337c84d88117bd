"""Tests of :mod:`costaware.reporting`."""

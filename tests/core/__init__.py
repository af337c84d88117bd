"""Tests of :mod:`costaware.core`."""

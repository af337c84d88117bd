"""Tests of :mod:`costaware.zoo`."""

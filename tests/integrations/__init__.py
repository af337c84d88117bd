"""Tests of :mod:`costaware.integrations`."""

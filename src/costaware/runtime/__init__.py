"""A study's runtime: the gate that judges a trial, the observation store, online refits
and calibration on the user's device.

Built on :mod:`costaware.core` and :mod:`costaware.measure`; knows nothing of reports or
of the HPO frameworks."""

"""Backends start runners: ``local`` (a subprocess); cluster backends plug in through ``base.Backend``."""

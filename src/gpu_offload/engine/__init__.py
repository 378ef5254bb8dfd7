"""The shared engine every front end drives: a request, its bundle, a backend that starts runners, and the
engine that follows a run's events into results.

``request`` validates what a cell or script asks for, ``execution`` carries one run from launch to result,
``engine`` follows events, ``backends`` start runners (``local``, ``kube``), ``trust`` decodes what an
untrusted cluster sends back.
"""

"""The kubernetes backend: each offloaded cell runs the runner in a pod on a Liqo virtual node.

``config`` reads the settings, ``pods`` is the only module that talks to the API, ``explain`` turns pod
states into sentences, ``follow`` reads a pod's frames from its log, ``run``/``session`` are the runs the
engine follows and ``backend`` ties them to placement and cleanup.
"""

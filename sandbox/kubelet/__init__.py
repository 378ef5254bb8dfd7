"""The test kubelet: a bound pod's containers as local processes, with their files, network, probes, and the
service proxy with its EndpointSlices."""

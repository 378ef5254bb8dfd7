"""The test kubelet: a bound pod's containers as local processes, with their files, network, probes and logs."""

"""The emulated kube-apiserver: storage, admission, validation, the HTTP API and its watch stream."""

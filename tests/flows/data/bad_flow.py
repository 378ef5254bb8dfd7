"""One step with bad @gpu_offload input, chosen by BAD_CASE; the other steps are fine."""

import os

from metaflow import FlowSpec, gpu_offload, kubernetes, resources, step

CASES = {
    "gpus-not-integer": lambda f: gpu_offload(gpus="two")(f),
    "gpus-float": lambda f: gpu_offload(gpus=1.5)(f),
    "unknown-argument": lambda f: gpu_offload(gpu=1)(f),
    "conflict-gpu": lambda f: gpu_offload(gpus=1)(kubernetes(gpu=2)(f)),
    "conflict-resources": lambda f: gpu_offload(gpus=1)(resources(gpu=2)(f)),
    "conflict-selector": lambda f: gpu_offload(cluster="donor-a")(
        kubernetes(node_selector={"liqo.io/remote-cluster-id": "donor-z"})(f)
    ),
}


class BadFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @CASES[os.environ["BAD_CASE"]]
    @step
    def train(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    BadFlow()

"""Two offloaded steps between plain ones. OFFLOAD_OFF=1 drops @gpu_offload (the baseline to compare)."""

import os

from metaflow import FlowSpec, gpu_offload, kubernetes, step


def offload(**kwargs):
    return (lambda f: f) if os.environ.get("OFFLOAD_OFF") else gpu_offload(**kwargs)


class OffloadFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @offload(gpus=1, gpu_model="A100")
    @kubernetes(memory=8000, labels={"team": "ml"}, tolerations=[{"key": "spot", "operator": "Exists"}])
    @step
    def train(self):
        self.next(self.evaluate)

    @offload(gpus=2, cluster="donor-b")
    @step
    def evaluate(self):
        self.next(self.end)

    @kubernetes(cpu=2)
    @step
    def end(self):
        pass


if __name__ == "__main__":
    OffloadFlow()

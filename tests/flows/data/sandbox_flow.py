"""Runs `train` as a Kubernetes Job on a Liqo virtual node of the sandbox; start and end run locally."""

import os

from metaflow import FlowSpec, environment, gpu_offload, step

# What a real cluster gives pods through a Secret or a service account; moto accepts any key.
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


class SandboxFlow(FlowSpec):
    @step
    def start(self):
        self.numbers = list(range(10))
        self.next(self.train)

    @gpu_offload(gpus=1, gpu_model="A100")
    @environment(vars=S3_CREDENTIALS)
    @step
    def train(self):
        self.total = sum(self.numbers)
        self.ran_in_pod = os.environ.get("METAFLOW_KUBERNETES_WORKLOAD") == "1"
        self.placement = os.environ.get("METAFLOW_GPU_OFFLOAD_PLACEMENT")
        print(f"total={self.total} in pod={self.ran_in_pod}")
        self.next(self.end)

    @step
    def end(self):
        print("done", self.total)


if __name__ == "__main__":
    SandboxFlow()

"""Runs `train` on half of a GPU: a Kubernetes Job asking a donor that shares its GPUs for it in the donor's units."""

import os

from metaflow import FlowSpec, environment, gpu_offload, step

S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


class PartFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @gpu_offload(gpus=0.5)
    @environment(vars=S3_CREDENTIALS)
    @step
    def train(self):
        self.devices = os.environ.get("NVIDIA_VISIBLE_DEVICES")
        self.placement = os.environ.get("METAFLOW_GPU_OFFLOAD_PLACEMENT")
        self.told = {k: v for k, v in os.environ.items() if k.startswith("GPU_OFFLOAD_GPU_") or k.startswith("CUDA_MPS")}
        print(f"on {self.devices}")
        self.next(self.end)

    @step
    def end(self):
        print("done", self.devices)


if __name__ == "__main__":
    PartFlow()

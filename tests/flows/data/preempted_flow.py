"""`train` queues through Kueue at the batch priority and runs long enough for a higher-priority run to preempt
it; each start of it prints a line, so a rerun shows."""

import time

from metaflow import FlowSpec, environment, gpu_offload, step

S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


class PreemptedFlow(FlowSpec):
    @step
    def start(self):
        self.numbers = list(range(10))
        self.next(self.train)

    @gpu_offload(gpus=1, gpu_model="A100", priority="batch", untrusted_ok=True)
    @environment(vars=S3_CREDENTIALS)
    @step
    def train(self):
        print("train started", flush=True)
        time.sleep(20)
        self.total = sum(self.numbers)
        print(f"total={self.total} after the rerun")
        self.next(self.end)

    @step
    def end(self):
        print("done", self.total)


if __name__ == "__main__":
    PreemptedFlow()

"""`train` asks for a GPU through Kueue with the batch priority: its Job waits in the queue, then runs on the
donor Kueue picks (`untrusted_ok`: no trusted cluster narrows the choice)."""

from metaflow import FlowSpec, environment, gpu_offload, step

S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


class QueuedFlow(FlowSpec):
    @step
    def start(self):
        self.numbers = list(range(10))
        self.next(self.train)

    @gpu_offload(gpus=1, gpu_model="A100", priority="batch", untrusted_ok=True)
    @environment(vars=S3_CREDENTIALS)
    @step
    def train(self):
        self.total = sum(self.numbers)
        print(f"total={self.total} after the queue")
        self.next(self.end)

    @step
    def end(self):
        print("done", self.total)


if __name__ == "__main__":
    QueuedFlow()

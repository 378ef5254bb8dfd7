"""No decorator at all: `--with gpu_offload` adds it to every step."""

from metaflow import FlowSpec, step


class PlainFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    PlainFlow()

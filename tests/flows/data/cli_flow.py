"""No decorator in the source: `run --with gpu_offload:...` offloads both steps.

The pods read S3 credentials from a Kubernetes Secret named by METAFLOW_KUBERNETES_SECRETS, as on a real
cluster, since nothing in this file may say where the steps run.
"""

import os

from metaflow import FlowSpec, step


class CliFlow(FlowSpec):
    @step
    def start(self):
        self.numbers = list(range(10))
        self.start_in_pod = os.environ.get("METAFLOW_KUBERNETES_WORKLOAD") == "1"
        self.next(self.end)

    @step
    def end(self):
        self.total = sum(self.numbers)
        self.end_in_pod = os.environ.get("METAFLOW_KUBERNETES_WORKLOAD") == "1"
        print(f"total={self.total} in pod={self.end_in_pod}")


if __name__ == "__main__":
    CliFlow()

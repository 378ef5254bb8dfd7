# Metaflow's names are dynamic for a type checker: `gpu_offload` is added to `metaflow` by the extension
# when it is imported, and a Parameter reads as its value inside a step.
# mypy: disable-error-code="attr-defined, call-overload"
"""A small PyTorch training flow whose `train` step runs on a GPU lent through Liqo.

    python train_flow.py run                                  # train on a remote GPU (needs the cluster)
    METAFLOW_GPU_OFFLOAD_BACKEND=local python train_flow.py run  # no cluster: train here, on CPU
    python train_flow.py argo-workflows create                # deploy; the train pod gets the GPU

The step uses CUDA when the pod sees a GPU and the CPU otherwise, so the same code runs everywhere.
"""

from metaflow import FlowSpec, Parameter, gpu_offload, step


class TrainFlow(FlowSpec):
    """Fit a two-layer network to a noisy sine and keep the trained weights as an artifact."""

    epochs = Parameter("epochs", default=200, help="training epochs")
    samples = Parameter("samples", default=512, help="training points")

    @step
    def start(self):
        import math
        import random

        rng = random.Random(0)
        xs = [rng.uniform(-math.pi, math.pi) for _ in range(self.samples)]
        self.data = [(x, math.sin(x) + rng.gauss(0.0, 0.05)) for x in xs]
        self.next(self.train)

    @gpu_offload(gpus=1)
    @step
    def train(self):
        import torch

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        x = torch.tensor([[p[0]] for p in self.data], device=self.device)
        y = torch.tensor([[p[1]] for p in self.data], device=self.device)
        model = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(self.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        self.losses = []
        for _ in range(self.epochs):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            self.losses.append(float(loss))
        self.weights = {k: v.cpu() for k, v in model.state_dict().items()}
        print(f"trained on {self.device}: loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}")
        self.next(self.end)

    @step
    def end(self):
        print(f"final loss {self.losses[-1]:.4f} after {len(self.losses)} epochs on {self.device}")


if __name__ == "__main__":
    TrainFlow()

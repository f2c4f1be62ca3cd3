"""A variational autoencoder's training step written with ``torch.distributions``, as its tutorials
write it: an MLP encoder (784 -> 1024 -> 1024) giving the posterior ``Normal(mu, sigma)`` over 32
latents, a sample by ``rsample()``, the KL divergence to the prior ``Normal(0, 1)`` by
``kl_divergence``, an MLP decoder giving ``Bernoulli(logits=...)`` and the reconstruction's
``log_prob`` of the binarised images; batches of 256 images of 28 x 28 drawn on the GPU, Adam,
fp32. The distributions keep their default argument validation (on unless Python runs with -O):
each constructor checks its parameters against their constraints and ``log_prob`` checks its
value's support, each check a reduction read back by an ``if not valid.all()``.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.

Defect: six waits for the GPU a step, hidden in the library's argument checks (the five
parameters of three constructors and one ``log_prob``'s value), on a small step whose launches
set the pace.

    python w_vae_distributions_train.py [--steps 40] [--fix no_validate] [--fix no_validate_graph] [--fix fused_adam]

Fixes:
  no_validate        ``validate_args=False`` for the three distributions: no check, no wait.
  no_validate_graph  as no_validate, and the whole step (with ``Adam(capturable=True)``)
                     captured in one CUDA graph, replayed each step.
  fused_adam         ``Adam(fused=True)``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch.distributions import Bernoulli, Normal, kl_divergence

from _corpus import body_step, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("no_validate", "no_validate_graph", "fused_adam")
CUDA_ONLY = ("no_validate_graph",)


class VAE(nn.Module):
    def __init__(self, pixels: int, hidden: int, latent: int) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(pixels, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 2 * latent))
        self.dec = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, pixels))

    def loss(self, x: torch.Tensor, validate: bool) -> torch.Tensor:
        """The negative ELBO per image (nats), averaged over the batch."""
        mu, log_sigma = self.enc(x).chunk(2, dim=1)
        q = Normal(mu, log_sigma.exp(), validate_args=validate)
        prior = Normal(torch.zeros_like(mu), torch.ones_like(mu), validate_args=validate)
        z = q.rsample()
        recon = Bernoulli(logits=self.dec(z), validate_args=validate)
        return (kl_divergence(q, prior).sum(1) - recon.log_prob(x).sum(1)).mean()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (its loss)."""
    pixels, hidden, latent, batch = 784, 1024, 32, 256
    if args.small:
        pixels, hidden, latent, batch = 12, 8, 3, 4
    torch.manual_seed(0)
    model = VAE(pixels, hidden, latent).to(dev).train()
    graph = "no_validate_graph" in fixes
    validate = not (graph or "no_validate" in fixes)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True if "fused_adam" in fixes else None,
                           capturable=graph)
    # images with a structure to learn: a fixed random template per class, pixels drawn around it
    templates = torch.rand(10, pixels, device=dev)

    def loss_of() -> torch.Tensor:
        cls = torch.randint(0, 10, (batch,), device=dev)
        return model.loss(torch.bernoulli(templates[cls]), validate)

    return body_step(loss_of, opt, graph)


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, alternatives=[("no_validate", "no_validate_graph")],
                                    steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_vae_distributions_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()

"""Train a small attention model with clattn's attention (forward and backward on the clattn
device) and the same model with torch's own nn.MultiheadAttention from the same initial
weights, and print both loss curves side by side.

    python3 examples/train_attention.py [--steps 20] [--lr 0.05]

Needs torch and numpy (Debian's python3-torch is enough) and libclattn (set CLATTN_LIBRARY
to build/libclattn.so and PYTHONPATH to python/ when running from the source tree)."""

import argparse

import torch
from torch import nn

import clattn


class Model(nn.Module):
    """Two self-attention layers, each with a residual, then a linear head."""

    def __init__(self, make_attention, embed=16, heads=4, outputs=4):
        super().__init__()
        self.layers = nn.ModuleList([make_attention(embed, heads) for _ in range(2)])
        self.head = nn.Linear(embed, outputs)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x, x, x, need_weights=False)[0]
        return self.head(x)


def train(model, x, target, steps, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.manual_seed(0)
    ours = Model(lambda e, h: clattn.MultiheadAttention(e, h, batch_first=True))
    theirs = Model(lambda e, h: nn.MultiheadAttention(e, h, batch_first=True))
    theirs.load_state_dict(ours.state_dict())  # the same starting point
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 10, 16, generator=gen)
    target = torch.randn(4, 10, 4, generator=gen)

    a = train(ours, x, target, args.steps, args.lr)
    b = train(theirs, x, target, args.steps, args.lr)
    print(f"device: {clattn.default_context().device_name}")
    print(f"{'step':>4}  {'clattn':>12}  {'torch':>12}  {'rel. diff':>10}")
    for i, (u, v) in enumerate(zip(a, b)):
        print(f"{i:4d}  {u:12.6f}  {v:12.6f}  {abs(u - v) / abs(v):10.2e}")
    worst = max(abs(u - v) / abs(v) for u, v in zip(a, b))
    print(f"loss {a[0]:.6f} -> {a[-1]:.6f} (clattn), {b[0]:.6f} -> {b[-1]:.6f} (torch); "
          f"largest relative difference {worst:.2e}")


if __name__ == "__main__":
    main()

"""A small CNN on the simulated device, eager and compiled, forward and backward.

Three conv blocks (conv 3x3, batch norm, ReLU, max-pool) and a linear classifier on
32x32 RGB images, batch 16. One training step (forward, loss, backward, SGD) is profiled
end to end; the top ops by modeled device time are printed.

Run: python examples/models/cnn.py [--mode eager|compiled] [--device sim|cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        chans = (3, 32, 64, 128)
        self.blocks = nn.Sequential(*(
            nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))
            for cin, cout in zip(chans, chans[1:])
        ))
        self.head = nn.Linear(128 * 4 * 4, classes)

    def forward(self, x):
        return self.head(self.blocks(x).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    parser.add_argument("--device", choices=("sim", "cpu", "cuda"), default="sim")
    parser.add_argument("--out", default="profile_out/cnn")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    from tilescope.profiler import profile

    if args.device == "sim":
        import tilescope.device

        tilescope.device.register()
        tilescope.device.configure(clock="virtual")
    torch.manual_seed(0)
    model = SmallCNN().to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, 3, 32, 32).to(args.device)
    y = torch.randint(0, 10, (args.batch,)).to(args.device)
    fwd = model if args.mode == "eager" else torch.compile(model, backend="tilescope" if args.device == "sim" else "inductor")

    def step():
        loss = F.cross_entropy(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(2):  # warm-up: builds every Program (and compiles); the optimizer's first
        step()  # step makes its state and takes another path than the profiled one
    sync = {"sim": lambda: torch.sim.synchronize(), "cuda": torch.cuda.synchronize}.get(args.device, lambda: None)
    sync()
    warm = time.perf_counter() - t0
    with profile(f"{args.out}_{args.mode}_{args.device}", device=args.device) as prof:
        loss = step()
    label = "modeled" if args.device == "sim" else f"measured on {args.device}"
    print(f"CNN {args.mode} on {args.device}: loss {loss.item():.4f}; warm-up (2 steps) {warm:.1f} s wall")
    print(f"top ops by self device time ({label}):")
    sort = "self_device_time_total" if args.device != "cpu" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=15))
    print(f"profile: {prof.profile_dir}")


if __name__ == "__main__":
    main()

"""tilescope: a hardware-free re-creation of a Trainium-class accelerator's PyTorch toolchain."""

__version__ = "0.1.0"

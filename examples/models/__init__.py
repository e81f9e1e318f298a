"""Models written in this repository (no downloads, no transformers / timm / torchvision): the zoo
that ``python -m examples.models.zoo`` runs eager and compiled on the simulated device."""

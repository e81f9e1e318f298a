"""tilescope's examples (importable so that ``python -m examples.models.zoo`` runs from the repository root)."""

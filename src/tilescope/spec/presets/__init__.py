"""One module per hardware preset; each defines ``PRESETS: dict[str, CoreSpec]``."""

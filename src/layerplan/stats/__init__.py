"""Statistical efficiency: measured properties of optimisation runs (pure NumPy)."""

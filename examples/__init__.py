"""Example corral apps, importable from the repository root (``examples.shop:app``)."""

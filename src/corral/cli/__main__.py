"""``python -m corral.cli``: the same as the ``corral`` command."""

from corral.cli import main

if __name__ == "__main__":
    main()

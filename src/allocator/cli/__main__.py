"""``python -m allocator.cli``: the same entry point as the ``allocator`` script."""

from allocator.cli import main

main()

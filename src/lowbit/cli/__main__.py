"""`python -m lowbit.cli`: the `lowbit` command."""

from . import main

main()

"""`python -m aprilsim` is the `aprilsim` command."""

from aprilsim.cli import main

main()

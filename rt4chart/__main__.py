"""``python -m rt4chart`` runs the ``rt4`` command."""

from rt4chart.cli.app import main

main()

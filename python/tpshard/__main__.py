"""python -m tpshard ...: the tpshard command."""
from ._cli import main

main()

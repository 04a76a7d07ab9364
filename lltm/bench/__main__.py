"""``python -m lltm.bench``."""
from .runner import main

main()

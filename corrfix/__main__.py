"""``python -m corrfix`` runs the command line."""

import sys

from corrfix._cli import main

sys.exit(main())

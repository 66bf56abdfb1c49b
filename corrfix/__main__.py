"""``python -m corrfix`` runs the command line."""

import sys

from corrfix._main import main

sys.exit(main())

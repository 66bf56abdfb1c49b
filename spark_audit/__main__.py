"""``python -m spark_audit DIR -o REPORT_DIR``, and the file to give spark-submit:

    spark-submit --master URL "$(python -c 'import spark_audit.__main__ as m; print(m.__file__)')" \
        DIR -o REPORT_DIR

The package must be importable on the driver and the executors (installed, or shipped with
``--py-files``); see docs/audit.md.
"""

import sys
from pathlib import Path

if not __package__:
    # Run as a file, this directory is sys.path[0], and its packages (source, decode, report,
    # ...) would shadow top-level ones of the same name; import them through the package only.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

from spark_audit import main

if __name__ == "__main__":
    sys.exit(main())

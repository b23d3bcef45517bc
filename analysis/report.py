"""Every study whose results are present: python analysis/report.py RESULTS_DIR -o REPORT_DIR.

Exit status 1 when a bound is violated; the same as `hpcpipe analyze`.
"""

import sys

from hpcpipe.studies.report import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

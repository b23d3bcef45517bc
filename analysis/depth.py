"""Study 'depth': see hpcpipe/studies/depth.py for the math and the checks.

Usage: python analysis/depth.py RESULTS_DIR [-o REPORT_DIR]
"""

import sys

from hpcpipe.studies.report import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--study", "depth"]))

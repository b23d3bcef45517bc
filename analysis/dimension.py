"""Study 'dimension': see hpcpipe/studies/dimension.py for the math and the checks.

Usage: python analysis/dimension.py RESULTS_DIR [-o REPORT_DIR]
"""

import sys

from hpcpipe.studies.report import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--study", "dimension"]))

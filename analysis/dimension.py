"""Study 'dimension': see hpcpipe/analysis/dimension.py for the math and the checks.

Usage: python analysis/dimension.py RESULTS_DIR [-o REPORT_DIR]
"""

import sys

from hpcpipe.analysis.report import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--study", "dimension"]))

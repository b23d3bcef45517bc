"""Study 'paper': see hpcpipe/analysis/paper.py for the math and the checks.

Usage: python analysis/paper.py RESULTS_DIR [-o REPORT_DIR]
"""

import sys

from hpcpipe.analysis.report import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--study", "paper"]))
